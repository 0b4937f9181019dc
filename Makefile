# ukv_torch: `make demo` and `make test` set up a fresh machine themselves.
#   make deps    install what is missing: torch ($(TORCH)), ninja, pytest, ...; GoogleTest,
#                Google Benchmark and CMake from Debian's packages for the C++ core tests
#   make build   compile ukv_torch._C (pip install --no-build-isolation -e .)
#   make test    C++ core unit tests (ctest) + the GPU-toolchain compile check + pytest
#   make mooncake-deps  Mooncake (the Mooncake Store tier): its wheel and Debian's libibverbs1
#   make offline-wheels  Mooncake for a host without PyPI, in build/wheels (benchmarks/offline_mooncake.sh)
#   make demo    python -m ukv_torch.demo
#   make sanitize  the C++ core tests under ASan + UBSan
#   make bench   the benchmarks in benchmarks/ (GPU ones need a GPU)
#   make soak    10M+ randomized allocator operations, invariants sampled, leaks and RSS checked
#   make bench-kernels  the index-kernel benchmark (GPU machine; JSON in build/)

PYTHON ?= python3
# The default installs quickly here (a local CPU wheel); on a GPU host choose e.g.
# TORCH="torch --index-url <your CUDA index>" or keep the torch you already have.
TORCH ?= torch==2.13.0
PIP := $(PYTHON) -m pip
PYDEPS := ninja pytest hypothesis numpy xxhash
APTDEPS := cmake ninja-build libgtest-dev libbenchmark-dev
# Mooncake's transfer engine links libibverbs even where it only uses TCP. Its
# wheel is the CUDA one for a CUDA torch, the -non-cuda one otherwise.
MOONCAKE_APTDEPS := libibverbs1
BUILD_DIR ?= build/core
PYTEST_ARGS ?=

.PHONY: soak sanitize deps pydeps sysdeps mooncake-deps offline-wheels build cpp-test pytest test demo bench gpu-compile-check hip-toolchain bench-kernels clean

deps: pydeps sysdeps mooncake-deps

# $(call apt-install,PACKAGES): install those of PACKAGES Debian does not have yet
apt-install = missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

pydeps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install "$(TORCH)"
	@$(PYTHON) -c "import ninja, pytest, hypothesis, numpy, xxhash" 2>/dev/null || $(PIP) install $(PYDEPS)

sysdeps:
	@$(call apt-install,$(APTDEPS))

mooncake-deps: pydeps
	@$(call apt-install,$(MOONCAKE_APTDEPS))
	@$(PYTHON) -c "import mooncake.store, mooncake.engine" 2>/dev/null || $(PIP) install \
	  "$$($(PYTHON) -c 'import torch; print("mooncake-transfer-engine" if torch.version.cuda else "mooncake-transfer-engine-non-cuda")')"

# Mooncake for a host that cannot reach PyPI (the GPU machine): the -non-cuda wheel for
# OFFLINE_PY's CPython (44 MiB) and, from this host, the system libraries its engine links,
# which benchmarks/offline_mooncake.sh uses there where the host lacks them.
OFFLINE_PY ?= 3.12
MOONCAKE_VERSION ?= 0.3.13.post1
OFFLINE_DIR ?= build/wheels
GLIBC_LIBS := '^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libresolv)\.so'

offline-wheels: mooncake-deps
	@mkdir -p $(OFFLINE_DIR)
	$(PIP) download -q --no-deps --only-binary=:all: --python-version $(OFFLINE_PY) --implementation cp \
	  --platform manylinux_2_28_x86_64 -d $(OFFLINE_DIR) mooncake-transfer-engine-non-cuda==$(MOONCAKE_VERSION)
	@rm -rf build/syslibs && mkdir -p build/syslibs/lib
	ldd "$$($(PYTHON) -c 'import mooncake.engine as e; print(e.__file__)')" | \
	  awk '$$2 == "=>" && $$3 ~ /^\/(usr\/)?lib/ {print $$1, $$3}' | grep -vE $(GLIBC_LIBS) | \
	  while read name path; do cp -L "$$path" "build/syslibs/lib/$$name"; done
	tar -cJf $(OFFLINE_DIR)/mooncake-syslibs-x86_64.tar.xz -C build/syslibs lib
	@ls -l $(OFFLINE_DIR)

build: pydeps
	$(PIP) install --no-build-isolation --no-deps -e . -q

cpp-test: sysdeps
	cmake -S csrc/core -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD_DIR)
	ctest --test-dir $(BUILD_DIR) --output-on-failure

pytest: build mooncake-deps
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

test: cpp-test gpu-compile-check pytest

# The C++ core tests under AddressSanitizer and UndefinedBehaviorSanitizer.
SANITIZE_DIR ?= build/core-sanitize
sanitize: sysdeps
	cmake -S csrc/core -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DUKV_SANITIZE=address;undefined" >/dev/null
	cmake --build $(SANITIZE_DIR) --target core_tests
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 $(SANITIZE_DIR)/core_tests

# ---- GPU toolchain compile proof (no GPU needed) -------------------------------
# The torch-free kernel launchers (csrc/kernels) built as they are, compile only,
# with nvcc for NVIDIA and with Debian's hipcc forced onto the AMD platform
# (hipcc picks NVIDIA when CUDA is installed). A HIP architecture the installed
# clang does not know (gfx942 needs a newer LLVM than Debian's) is reported and
# skipped; one it knows must compile without warnings.
NVCC ?= nvcc
HIPCC ?= hipcc
NVCC_ARCHS ?= sm_90
HIP_ARCHS ?= gfx90a gfx940 gfx942
HIP_APTDEPS := hipcc libamdhip64-dev rocm-device-libs
GPU_CHECK_DIR ?= build/gpu-compile-check
KERNEL_LAUNCHERS := $(wildcard csrc/kernels/*.cu)
GPU_WARNINGS := -Wall -Wextra -Werror

hip-toolchain:
	@$(call apt-install,$(HIP_APTDEPS))

gpu-compile-check: hip-toolchain
	@command -v $(NVCC) >/dev/null || { echo "gpu-compile-check: $(NVCC) not found; install the CUDA toolkit or set NVCC=/path/to/nvcc"; exit 1; }
	@mkdir -p $(GPU_CHECK_DIR)
	@for arch in $(NVCC_ARCHS); do \
	  for src in $(KERNEL_LAUNCHERS); do \
	    $(NVCC) -std=c++17 -arch=$$arch -Icsrc -Werror all-warnings -Xcompiler $$(echo $(GPU_WARNINGS) | tr ' ' ,) \
	      -c $$src -o $(GPU_CHECK_DIR)/$$(basename $$src .cu).$$arch.o || exit 1; \
	  done; \
	  echo "gpu-compile-check: nvcc $$arch ok"; \
	done
	@printf '#include <hip/hip_runtime.h>\n__global__ void ukv_probe() {}\n' > $(GPU_CHECK_DIR)/probe.hip
	@for arch in $(HIP_ARCHS); do \
	  if ! HIP_PLATFORM=amd $(HIPCC) --offload-arch=$$arch -c $(GPU_CHECK_DIR)/probe.hip -o $(GPU_CHECK_DIR)/probe.o >/dev/null 2>&1; then \
	    echo "gpu-compile-check: hipcc does not know $$arch; skipped"; continue; \
	  fi; \
	  for src in $(KERNEL_LAUNCHERS); do \
	    HIP_PLATFORM=amd $(HIPCC) -std=c++17 --offload-arch=$$arch -Icsrc $(GPU_WARNINGS) -x hip \
	      -c $$src -o $(GPU_CHECK_DIR)/$$(basename $$src .cu).$$arch.o || exit 1; \
	  done; \
	  echo "gpu-compile-check: hipcc $$arch ok"; \
	done

demo: build
	@$(PYTHON) -c "import matplotlib" 2>/dev/null || $(PIP) install -q matplotlib
	$(PYTHON) -m ukv_torch.demo

bench: build cpp-test
	$(BUILD_DIR)/bench_core --benchmark_min_time=0.2
	$(PYTHON) benchmarks/bench_allocator.py
	$(PYTHON) benchmarks/bench_manager.py
	@$(PYTHON) -c "import matplotlib" 2>/dev/null || $(PIP) install -q matplotlib
	$(PYTHON) benchmarks/capacity.py --plot benchmarks/capacity.png
	$(PYTHON) benchmarks/capacity.py --sweep --out benchmarks/capacity_sweep.md

SOAK_OPS ?= 10000000
soak: build
	$(PYTHON) benchmarks/soak.py --ops $(SOAK_OPS)

bench-kernels: build
	$(PYTHON) benchmarks/bench_kernels.py --out build/bench_kernels.json

clean:
	rm -rf build $(BUILD_DIR) *.egg-info ukv_torch/_C*.so ukv_torch/_build_info.py
