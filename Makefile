# make test      the whole suite (what CI runs, after installing packages)
# make fuzz      every fuzz target in the tree for FUZZTIME (5s) each
# make examples  build every example program into examples/wasm/out/
# make build     the host binary into bin/host

.PHONY: test examples build fuzz

test:
	go vet ./...
	go test -race -parallel 4 -timeout 20m ./...
	$(MAKE) fuzz

# FUZZTIME is how long each fuzz target runs; FUZZ_TARGETS is every
# func FuzzX in a test file, as DIR:FuzzX, so a new target runs without
# being listed here.
FUZZTIME ?= 5s
FUZZ_TARGETS = $(shell grep -r --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*' . | sed -E 's|^\./(.*)/[^/]*:func (.*)|\1:\2|' | sort)

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "go test -run='^$$' -fuzz='^$${t#*:}$$' -fuzztime=$(FUZZTIME) ./$${t%:*}"; \
		go test -run='^$$' -fuzz="^$${t#*:}\$$" -fuzztime=$(FUZZTIME) ./$${t%:*} || exit 1; \
	done

examples:
	go run ./cmd/host examples

build:
	go build -o bin/host ./cmd/host
