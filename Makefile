# kedge - see README.md. The two user-facing targets are `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
export CGO_ENABLED := 0
BIN := bin/kedge

.PHONY: all deps generate check-generated build test test-unit test-kernels demo vet clean cleanup fuzz install uninstall image deb helm

all: build

deps:
	@./scripts/deps.sh

# Regenerates the bpf2go bindings (Go + .o) from bpf/. Output is committed.
generate: deps
	@./scripts/generate.sh

# Fails when the committed bindings differ from what `make generate` produces.
check-generated: generate
	@if [ -n "$$(git status --porcelain -- internal)" ]; then \
		echo "generated BPF bindings are stale - run 'make generate' and commit the result:"; \
		git status --porcelain -- internal; exit 1; fi

# The binary knows its commit (kedge version, benchmark envelopes); "-dirty" marks local changes.
COMMIT = $(shell git describe --always --dirty --abbrev=40 --match=NeVeR 2>/dev/null)

build: deps
	@$(GO) build -trimpath -ldflags "-s -w -X github.com/kedge-dev/kedge/internal/version.Commit=$(COMMIT)" -o $(BIN) ./cmd/kedge

# The binary on the PATH (what the lab's "Next:" hints and docs run as a bare 'kedge').
PREFIX ?= /usr/local
install: build
	@install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/kedge
	@echo "installed $(DESTDIR)$(PREFIX)/bin/kedge"

uninstall:
	@rm -f $(DESTDIR)$(PREFIX)/bin/kedge

# Packaging, offline (docs/deploy.md): the OCI image FROM scratch (podman; saved as OCI and
# docker archives under bin/) and the Debian package with the kedge-agent systemd unit.
image: build
	@COMMIT=$(COMMIT) ./scripts/image.sh

deb: build
	@COMMIT=$(COMMIT) ./scripts/deb.sh

# Helm, built from the Go module proxy at the version the chart's tests use (no other
# download is reachable here): then 'bin/helm template kedge deploy/helm/kedge' works.
helm:
	@cd deploy/helm/chartcheck && $(GO) build -o ../../../bin/helm helm.sh/helm/v3/cmd/helm
	@echo "bin/helm: $$(bin/helm version --short)"

vet:
	@$(GO) vet ./...
	@files=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$files" ]; then \
		echo "not gofmt-formatted - run 'gofmt -w' on:"; echo "$$files"; exit 1; fi

test: check-generated build vet
	@./scripts/test.sh

fuzz: build
	@$(GO) test ./internal/parsetest -run '^$$' -fuzz FuzzParse -fuzztime 60s

# Every package on every kernel of the matrix (docs/kernels.md). The limit is per kernel:
# a kernel's whole run (./internal/..., ./pkg/..., ./examples/...) took about 26 min on the busy 2-core development VM.
test-kernels: build
	@$(GO) run ./tools/vmtest -all -timeout 60m

# The main job on its default: what the kernel offers, then the thesis's Table 4.2 reproduced
# in a lab (chaos server, baseline / app-hedged Python and Go / kernel-hedged clients), charts
# under results/hedge/thesis/; then the other capabilities (kedge demo tour): pping on a TCP
# flow, a scatter at fan-out 64, a 3-node raft cluster whose leader is killed, each with a
# one-line result and a chart under results/demo/, and a summary table. About 3 minutes.
demo: build
	@./$(BIN) cleanup --quiet
	@./$(BIN) probe
	@./$(BIN) bench hedge --scenario thesis --out results/hedge
	@./$(BIN) demo tour --out results/demo --hedge-result results/hedge/thesis/result.json

cleanup: build
	@./$(BIN) cleanup

clean:
	rm -rf bin
