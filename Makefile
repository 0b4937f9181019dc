# ukv_torch: `make demo` and `make test` set up a fresh machine themselves.
#   make deps    install what is missing: torch ($(TORCH)), ninja, pytest, ...; GoogleTest,
#                Google Benchmark and CMake from Debian's packages for the C++ core tests
#   make build   compile ukv_torch._C (pip install --no-build-isolation -e .)
#   make test    C++ core unit tests (ctest) + the GPU-toolchain compile check + pytest
#   make demo    python -m ukv_torch.demo
#   make bench   the benchmarks in benchmarks/ (GPU ones need a GPU)

PYTHON ?= python3
# The default installs quickly here (a local CPU wheel); on a GPU host choose e.g.
# TORCH="torch --index-url <your CUDA index>" or keep the torch you already have.
TORCH ?= torch==2.13.0
PIP := $(PYTHON) -m pip
PYDEPS := ninja pytest hypothesis numpy xxhash
APTDEPS := cmake ninja-build libgtest-dev libbenchmark-dev
BUILD_DIR ?= build/core
PYTEST_ARGS ?=

.PHONY: deps pydeps sysdeps build cpp-test pytest test demo bench gpu-compile-check clean

deps: pydeps sysdeps

pydeps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH)"
	@$(PYTHON) -c "import ninja, pytest, hypothesis, numpy, xxhash" 2>/dev/null || $(PIP) install $(PYDEPS)

sysdeps:
	@missing=""; for p in $(APTDEPS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build: pydeps
	$(PIP) install --no-build-isolation --no-deps -e . -q

cpp-test: sysdeps
	cmake -S csrc/core -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD_DIR)
	ctest --test-dir $(BUILD_DIR) --output-on-failure

pytest: build
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

test: cpp-test pytest

demo: build
	$(PYTHON) -m ukv_torch.demo

bench: build cpp-test
	$(BUILD_DIR)/bench_core --benchmark_min_time=0.2
	$(PYTHON) benchmarks/bench_allocator.py

clean:
	rm -rf build $(BUILD_DIR) *.egg-info ukv_torch/_C*.so ukv_torch/_build_info.py
