# Build every example program into examples/wasm/out/.
.PHONY: examples test build
examples:
	go run ./cmd/host build-examples

build:
	go build -o bin/host ./cmd/host

test:
	./.ci/test
