# make test      the whole suite (what CI runs, after installing packages)
# make fuzz      every fuzz target in the tree for FUZZTIME (5s) each (2s in make test)
# make examples  build every example program into examples/wasm/out/
# make build     the host binary into bin/host

.PHONY: test examples build fuzz

# The suite fuzzes each target for 2 s (most of a target's time is its
# instrumented build); `make fuzz` alone runs FUZZTIME, 5 s by default.
# The suite runs in two passes. The first runs every package under the
# race detector with -short, which skips the heavy tests: the multi-node
# clusters (but the few marked hosttest.Options.Race), the process tests,
# the soaks and the slow single-node ones (hosttest.Heavy). The second runs
# the packages that have heavy tests again, whole, without the race
# detector, which made them four times slower and held the suite past ten
# minutes on two cores.
test:
	go vet ./...
	go test -race -short -parallel 4 -timeout 20m ./...
	go test -parallel 4 -timeout 20m ./host/... ./cmd/... ./bench/...
	$(MAKE) fuzz FUZZTIME=2s

# FUZZTIME is how long each fuzz target runs; FUZZ_TARGETS is every
# func FuzzX in a test file, as DIR:FuzzX, so a new target runs without
# being listed here.
FUZZTIME ?= 5s
FUZZ_TARGETS = $(shell grep -r --include='*_test.go' -o '^func Fuzz[A-Za-z0-9_]*' . | sed -E 's|^\./(.*)/[^/]*:func (.*)|\1:\2|' | sort)

# A bare "context deadline exceeded" with no failing input written is Go's
# fuzz coordinator racing its own -fuzztime deadline (go.dev/issue/75804,
# fixed in Go 1.27): that target runs once more. Anything else fails.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=./$${t%:*}; name=$${t#*:}; \
		for try in 1 2; do \
			echo "go test -run='^$$' -fuzz='^$$name$$' -fuzztime=$(FUZZTIME) $$pkg"; \
			out=$$(go test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) $$pkg 2>&1); rc=$$?; \
			if [ $$rc -eq 0 ]; then echo "$$out" | tail -2; break; fi; \
			echo "$$out"; \
			if [ $$try -eq 1 ] && echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written'; then \
				echo "(the fuzz coordinator's deadline race, go.dev/issue/75804, no failing input: running $$name again)"; continue; \
			fi; \
			exit 1; \
		done; \
	done

examples:
	go run ./cmd/host examples

build:
	go build -o bin/host ./cmd/host
