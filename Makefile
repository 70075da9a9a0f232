# make test      the whole suite (what CI runs, after installing packages)
# make examples  build every example program into examples/wasm/out/
# make build     the host binary into bin/host

.PHONY: test examples build fuzz

test:
	go vet ./...
	go test -race -parallel 4 -timeout 20m ./...

examples:
	go run ./cmd/host examples

build:
	go build -o bin/host ./cmd/host
