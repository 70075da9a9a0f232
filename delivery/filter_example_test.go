package delivery_test

import (
	"fmt"

	"github.com/durable-host/host/delivery"
)

// A follow's filter selects events by top-level fields of their JSON
// payload; every condition must hold.
func ExampleParseFilter() {
	f, err := delivery.ParseFilter(`author=ann&urgent=true`)
	if err != nil {
		panic(err)
	}
	for _, p := range []string{
		`{"author":"ann","urgent":true,"text":"now"}`,
		`{"author":"ann","urgent":false}`,
		`{"author":"bob","urgent":true}`,
		`not json`,
	} {
		fmt.Println(f.Match([]byte(p)), p)
	}
	// Output:
	// true {"author":"ann","urgent":true,"text":"now"}
	// false {"author":"ann","urgent":false}
	// false {"author":"bob","urgent":true}
	// false not json
}

// A filter that does not parse is refused when the follow is asked.
func ExampleParseFilter_invalid() {
	_, err := delivery.ParseFilter(`author`)
	fmt.Println(err != nil)
	// Output: true
}
