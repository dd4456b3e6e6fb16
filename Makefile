# muster: one entry point. `make` builds, `make check` runs what CI runs,
# `make demo` shows a job on this machine heal a killed rank (mk/demo.py).
# Both check and demo first install missing Debian build dependencies
# (mk/deps.sh), then build in a sub-make so that pkg-config sees the freshly
# installed libraries (check makes the Python environment meanwhile).

VERSION := 0.1.0
PREFIX ?= /usr/local
DESTDIR ?=
BUILD ?= build

# Libraries found through pkg-config; OpenBLAS is only linked into muster-train.
PKGS := libuv libmicrohttpd jansson openssl libcurl
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null)

# NCCL backend of comm.h (worker/train/comm/comm_nccl.c): built when nccl.h is found;
# otherwise COMM_NCCL answers -ENOTSUP ("built without NCCL"). -isystem:
# NCCL's header is not -Wstrict-prototypes clean.
CUDA_HOME ?= /usr/local/cuda
HAVE_NCCL := $(shell test -f $(CUDA_HOME)/include/nccl.h && echo 1)
ifeq ($(HAVE_NCCL),1)
NCCL_CFLAGS := -DMUSTER_HAVE_NCCL -isystem $(CUDA_HOME)/include
NCCL_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart
else ifeq ($(MAKELEVEL),0)
$(info muster: $(CUDA_HOME)/include/nccl.h not found: building without the NCCL backend)
endif

# GPU path of muster-train (worker/train/gpu/): built when nvcc is found. One
# architecture (Hopper SASS) plus compute_80 PTX that the driver JIT-compiles
# on Ampere and anything newer than Hopper: one SASS keeps CI builds short.
NVCC := $(CUDA_HOME)/bin/nvcc
HAVE_CUDA := $(shell test -x $(NVCC) && echo 1)
ifeq ($(HAVE_CUDA),1)
NVCC_VERSION := $(shell $(NVCC) --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=compute_80
NVCCFLAGS := -std=c++17 -O2 -g -I. $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings \
	$(if $(HAVE_NCCL),-DMUSTER_HAVE_NCCL)
CUDA_CFLAGS := -DMUSTER_HAVE_CUDA -isystem $(CUDA_HOME)/include
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcublasLt -lcudart -lstdc++
ifeq ($(MAKELEVEL),0)
$(info muster: GPU path: on (nvcc $(NVCC_VERSION), $(CUDA_HOME)))
endif
else ifeq ($(MAKELEVEL),0)
$(info muster: GPU path: off (nvcc not found at $(CUDA_HOME)/bin/nvcc))
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter -Wno-format-truncation
BASE_CFLAGS := -std=gnu11 -O2 -g $(WARN) -I. -D_GNU_SOURCE -DMUSTER_VERSION='"$(VERSION)"'
# `make V=1` shows full command lines.
V ?= 0
ifeq ($(V),0)
Q := @
endif

# SAN is set by `make asan`; user CFLAGS come last.
ALL_CFLAGS = $(BASE_CFLAGS) $(PKG_CFLAGS) $(BLAS_CFLAGS) $(CHECK_CFLAGS) $(SAN) $(CFLAGS)
# The one C++ file (proto/realnum.cc) is built without exceptions or RTTI, so
# the programs linking it need no C++ runtime and stay linked by $(CC).
ALL_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -Wshadow -I. -fno-exceptions -fno-rtti $(SAN) $(CXXFLAGS)
ALL_LDFLAGS = $(SAN) $(LDFLAGS)

LIBS_UV := -luv
LIBS_HTTP := -lmicrohttpd
LIBS_JSON := -ljansson
LIBS_CRYPTO := -lcrypto
LIBS_CURL := -lcurl

# Each module lists its sources in its own fragment.
include common/module.mk
include proto/module.mk
include daemon/module.mk
include ctl/module.mk
include worker/module.mk
include tests/module.mk

obj = $(patsubst %.cc,$(BUILD)/obj/%.o,$(patsubst %.c,$(BUILD)/obj/%.o,$(1)))
# muster-train's loops outside sgemm run on OpenMP threads.
$(call obj,$(TRAIN_SRCS) $(TRAIN_MAIN)): ALL_CFLAGS += -fopenmp

# Named in --device gpu's messages: where the CUDA libraries were (or nvcc was not).
$(call obj,worker/train/gpu/gpu_load.c): ALL_CFLAGS += -DMUSTER_CUDA_HOME='"$(CUDA_HOME)"' \
	$(if $(HAVE_CUDA),-DMUSTER_HAVE_CUDA)
# With CUDA, the GPU path and comm.h's NCCL backend form muster-train-gpu.so
# (worker/train/gpu/gpu_module.h), which muster-train loads only for a GPU or
# NCCL: a CPU rank never maps CUDA. The module takes the trainer's CPU code
# (data, checkpoints, run loop) from the executable, which exports it
# (--export-dynamic), so there is one copy of it. The GPU check and benchmark
# link the same objects statically.
# Its objects are position-independent, in their own tree ($(BUILD)/pic/).
pic_obj = $(patsubst %,$(BUILD)/pic/%.o,$(basename $(1)))
ifeq ($(HAVE_CUDA),1)
GPU_OBJS := $(call pic_obj,$(GPU_SRCS) $(COMM_NCCL_SRC) $(GPU_CU_SRCS))
$(call obj,tests/gpu-check.c tests/bench/gpu/gpu-bench.c) $(call pic_obj,$(GPU_SRCS)): ALL_CFLAGS += $(CUDA_CFLAGS) -fopenmp
$(call pic_obj,$(COMM_NCCL_SRC)): ALL_CFLAGS += $(NCCL_CFLAGS)
GPU_LIBS := $(CUDA_LIBS)
GPU_MODULE := $(BUILD)/muster-train-gpu.so
TRAIN_EXPORT := -Wl,--export-dynamic
endif

LIB_OBJS := $(call obj,$(COMMON_SRCS) $(PROTO_SRCS))
LIBMUSTER := $(BUILD)/libmuster.a

BINS := $(BUILD)/musterd $(BUILD)/musterctl $(BUILD)/muster-worker $(BUILD)/muster-train

# Keep the objects that pattern chains make on the way (tests/%.c -> .o ->
# the tool): deleted, the next make (check's second) would build them again.
.SECONDARY:

.PHONY: all deps check check-run itest-durations check-mutants demo demo-run bench bench-run asan install uninstall clean tests docs
all: $(BINS) $(GPU_MODULE) $(BUILD)/python

# muster-worker finds the Python client and its start-up hook (startup/) in
# python/ beside it in a build directory, ../lib/muster/python once installed.
$(BUILD)/python:
	@mkdir -p $(BUILD)
	ln -sfn $(CURDIR)/clients/python $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $<")
	$(Q)$(CC) $(ALL_CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(ALL_CXXFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $< (PIC)")
	$(Q)$(CC) $(ALL_CFLAGS) -fPIC -MMD -MP -c -o $@ $<

$(BUILD)/pic/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  NVCC    $< (PIC)")
	$(Q)$(NVCC) $(NVCCFLAGS) -Xcompiler -fPIC -MMD -MP -c -o $@ $<

$(LIBMUSTER): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  AR      $@")
	$(Q)$(AR) rcs $@ $^

$(BUILD)/musterd: $(call obj,$(DAEMON_SRCS) $(DAEMON_MAIN)) $(LIBMUSTER)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_HTTP) $(LIBS_CURL) $(LIBS_JSON) $(LIBS_CRYPTO) -lpthread

$(BUILD)/musterctl: $(call obj,$(CTL_SRCS)) $(LIBMUSTER)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_CURL) $(LIBS_JSON) $(LIBS_CRYPTO)

$(BUILD)/muster-worker: $(call obj,$(AGENT_SRCS) $(AGENT_MAIN)) $(LIBMUSTER)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_JSON) $(LIBS_CRYPTO)

$(BUILD)/muster-train: $(call obj,$(TRAIN_SRCS) $(TRAIN_MAIN) $(TRAIN_LOAD_SRCS)) $(LIBMUSTER)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) $(TRAIN_EXPORT) -fopenmp -o $@ $^ $(BLAS_LIBS) $(LIBS_JSON) -lpthread -lm

# Undefined symbols are the trainer's, resolved against muster-train at dlopen.
ifeq ($(HAVE_CUDA),1)
$(GPU_MODULE): $(GPU_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -shared -fopenmp -o $@ $^ $(NCCL_LIBS) $(GPU_LIBS) -lm
endif

# Unit tests: one Check runner over every suite, linked with the modules'
# non-main objects so that suites drive the real code.
TEST_OBJS := $(call obj,$(CHECK_SRCS) $(DAEMON_SRCS) $(AGENT_SRCS) $(TRAIN_SRCS) $(COMM_NCCL_SRC))
$(BUILD)/tests/check_muster: $(TEST_OBJS) $(LIBMUSTER)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -fopenmp -o $@ $^ $(CHECK_LIBS) $(BLAS_LIBS) $(LIBS_UV) $(LIBS_HTTP) $(LIBS_CURL) $(LIBS_JSON) $(LIBS_CRYPTO) $(NCCL_LIBS) -lpthread -lm

# Only these two see CUDA headers.
$(BUILD)/obj/worker/train/comm/comm_nccl.o $(BUILD)/obj/tests/check_comm.o: ALL_CFLAGS += $(NCCL_CFLAGS)

# Collective bandwidth tool for tests/bench/bench_comm.sh.
$(BUILD)/tests/comm-bench: $(call obj,tests/comm-bench.c worker/train/comm/comm.c worker/train/comm/comm_ring.c worker/train/comm/comm_nccl.c)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(NCCL_LIBS) -lpthread -lm

# State write cost, file against etcd, for tests/bench/bench_failover.sh.
# (musterd's objects whole: a list of the few it uses fell behind rdv's split)
$(BUILD)/tests/store-bench: $(call obj,tests/store-bench.c $(DAEMON_SRCS)) $(LIBMUSTER)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_UV) $(LIBS_HTTP) $(LIBS_CURL) $(LIBS_JSON) $(LIBS_CRYPTO) -lpthread -lm

# ZeRO-3 vs plain data-parallel step times for tests/bench/bench_zero.sh.
$(BUILD)/tests/zero-bench: $(call obj,tests/zero-bench.c $(TRAIN_SRCS) $(COMM_NCCL_SRC)) $(LIBMUSTER)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -fopenmp -o $@ $^ $(BLAS_LIBS) $(LIBS_JSON) $(NCCL_LIBS) -lpthread -lm

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIBMUSTER)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_JSON) $(LIBS_CRYPTO) -lpthread -lm

# LD_PRELOAD'ed into musterd by tests (tests/preload/): a disk slow to make writes durable.
$(BUILD)/tests/slow_fsync.so: tests/preload/slow_fsync.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) -O2 -Wall -Wextra -shared -fPIC -o $@ $< -ldl

# GPU checks and benchmark (docs/gpu.md): they need a GPU to run, and say
# "no GPU: skipped" without one (REQUIRE_GPU=1 makes that a failure).
GPU_TOOL_OBJS = $(call obj,$(TRAIN_SRCS)) $(GPU_OBJS) $(LIBMUSTER)
$(BUILD)/tests/gpu-check: $(call obj,tests/gpu-check.c) $(GPU_TOOL_OBJS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -fopenmp -o $@ $^ $(BLAS_LIBS) $(LIBS_JSON) $(NCCL_LIBS) $(GPU_LIBS) -lpthread -lm

$(BUILD)/tests/gpu-bench: $(call obj,tests/bench/gpu/gpu-bench.c) $(GPU_TOOL_OBJS)
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CC) $(ALL_LDFLAGS) -fopenmp -o $@ $^ $(BLAS_LIBS) $(LIBS_JSON) $(NCCL_LIBS) $(GPU_LIBS) -lpthread -lm

.PHONY: check-gpu bench-gpu
ifeq ($(HAVE_CUDA),1)
check-gpu: $(BUILD)/tests/gpu-check $(BUILD)/muster-train $(GPU_MODULE)
	@BUILD=$(BUILD) REQUIRE_GPU=$(REQUIRE_GPU) sh tests/gpu-check.sh

bench-gpu: $(BUILD)/tests/gpu-bench
	@BUILD=$(BUILD) REQUIRE_GPU=$(REQUIRE_GPU) sh tests/bench/gpu/run.sh
else
check-gpu bench-gpu:
	@echo "$@: no GPU path in this build (nvcc not found at $(NVCC)): skipped"
	@test "$(REQUIRE_GPU)" != 1
endif

include tests/cuemu/module.mk

# cuemu's programs are left out of sanitizer builds: ASan handles every
# fiber switch (tens per emulated thread), which makes them 100x slower.
TEST_BINS := $(BUILD)/tests/check_muster $(patsubst %,$(BUILD)/tests/%,$(TEST_TOOLS)) \
	$(if $(SAN),,$(CUEMU_BINS) $(BUILD)/tests/slow_fsync.so)
ifeq ($(HAVE_CUDA),1)
TEST_BINS += $(BUILD)/tests/gpu-check $(BUILD)/tests/gpu-bench
endif
tests: $(BINS) $(GPU_MODULE) $(BUILD)/python $(TEST_BINS)

deps:
	@sh mk/deps.sh build

# The interpreter of the build's PyTorch 2.x environment (.venv, made by
# mk/deps.sh), with which the tests and benches run PyTorch, DeepSpeed and
# accelerate programs as ranks.
MUSTER_TORCH_PY ?= $(CURDIR)/.venv/bin/python
export MUSTER_TORCH_PY

# The Debian packages first; then the Python environment (pip: mostly
# downloads) is made while the tree builds (the compilers), and the tests
# start once the tree is built: those that need the environment wait for it
# (ITEST_VENV_STATUS, tests/run_integration.py), the others run meanwhile.
check:
	@sh mk/deps.sh system
	@mkdir -p $(BUILD) && rm -f $(BUILD)/venv.status && \
	{ sh mk/deps.sh venv > $(BUILD)/deps-venv.log 2>&1; echo $$? > $(BUILD)/venv.status; } & \
	$(MAKE) --no-print-directory tests; built=$$?; \
	if [ $$built -eq 0 ]; then \
	    ITEST_VENV_STATUS=$(BUILD)/venv.status ITEST_VENV_LOG=$(BUILD)/deps-venv.log \
	        $(MAKE) --no-print-directory check-run; rc=$$?; \
	else rc=$$built; fi; \
	wait; exit $$rc

check-run: tests
	@BUILD=$(BUILD) CUEMU=$(if $(SAN),off,on) sh tests/run.sh

# Copies the seconds each integration script took in the last run
# ($(BUILD)/itest-durations) into tests/integration/durations, the table
# by which tests/run_integration.py starts the longest first.
itest-durations:
	@BUILD=$(BUILD) python3 tests/run_integration.py --save-durations

# Key scenarios against musterd built with one feature broken on purpose
# (tests/mutants.sh): each must fail. Not part of check.
check-mutants: tests
	@BUILD=$(BUILD) sh tests/mutants.sh

demo: deps
	@$(MAKE) --no-print-directory demo-run

demo-run: all
	@BUILD=$(BUILD) python3 mk/demo.py

bench: deps
	@sh mk/deps.sh bench
	@$(MAKE) --no-print-directory bench-run

bench-run: all $(BUILD)/tests/auth-bench $(BUILD)/tests/store-bench $(BUILD)/tests/comm-bench $(BUILD)/tests/zero-bench $(BUILD)/tests/sim-agents $(BUILD)/tests/rest-load
	@BUILD=$(BUILD) sh tests/bench/run.sh

# AddressSanitizer + UBSan build of everything, then the whole test suite.
asan: deps
	@$(MAKE) --no-print-directory BUILD=build-asan \
	    SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	    check-run

docs: $(BUILD)/tests/jobspec-doc
	$(BUILD)/tests/jobspec-doc > docs/jobspec.md

# Installed layout: binaries, systemd units (ExecStart rewritten to PREFIX) and
# the sysusers.d/tmpfiles.d files of their users and /etc/muster,
# example configs and job presets, docs, man pages, and the rank clients
# (the C header under include/, the Python module in lib/muster/python/ for
# PYTHONPATH), and with CUDA muster-train's GPU module in lib/muster/, where
# muster-train looks for it (../lib/muster/ from bin/). DESTDIR for staging.
MAN1 := docs/man/muster-train.1 docs/man/musterctl.1
MAN8 := docs/man/musterd.8 docs/man/muster-worker.8
UNITDIR := $(PREFIX)/lib/systemd/system
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(PREFIX)/share/muster/etc \
	    $(DESTDIR)$(PREFIX)/share/doc/muster $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8 \
	    $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/lib/muster/python/startup \
	    $(DESTDIR)$(PREFIX)/lib/muster/python/muster_rank/sharded \
	    $(DESTDIR)$(PREFIX)/lib/sysusers.d $(DESTDIR)$(PREFIX)/lib/tmpfiles.d
	install -m 0755 $(BINS) $(DESTDIR)$(PREFIX)/bin/
	install -m 0644 systemd/muster.sysusers $(DESTDIR)$(PREFIX)/lib/sysusers.d/muster.conf
	install -m 0644 systemd/muster.tmpfiles $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/muster.conf
	for u in systemd/*.service; do \
	    sed 's|/usr/local/|$(PREFIX)/|g' $$u > $(DESTDIR)$(UNITDIR)/$${u#systemd/} && \
	    chmod 0644 $(DESTDIR)$(UNITDIR)/$${u#systemd/} || exit 1; done
	install -m 0644 etc/*.json $(DESTDIR)$(PREFIX)/share/muster/etc/
	install -m 0644 README.md docs/*.md proto/PROTOCOL.md $(DESTDIR)$(PREFIX)/share/doc/muster/
	install -m 0644 $(MAN1) $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 0644 $(MAN8) $(DESTDIR)$(PREFIX)/share/man/man8/
	install -m 0644 clients/c/muster_rank.h $(DESTDIR)$(PREFIX)/include/
	install -m 0644 clients/python/muster_spare.py $(DESTDIR)$(PREFIX)/lib/muster/python/
	install -m 0644 clients/python/muster_rank/*.py $(DESTDIR)$(PREFIX)/lib/muster/python/muster_rank/
	install -m 0644 clients/python/muster_rank/sharded/*.py $(DESTDIR)$(PREFIX)/lib/muster/python/muster_rank/sharded/
	install -m 0644 clients/python/startup/sitecustomize.py $(DESTDIR)$(PREFIX)/lib/muster/python/startup/
	$(if $(GPU_MODULE),install -m 0755 $(GPU_MODULE) $(DESTDIR)$(PREFIX)/lib/muster/)

uninstall:
	rm -f $(patsubst $(BUILD)/%,$(DESTDIR)$(PREFIX)/bin/%,$(BINS))
	rm -f $(patsubst systemd/%,$(DESTDIR)$(UNITDIR)/%,$(wildcard systemd/*.service))
	rm -f $(DESTDIR)$(PREFIX)/lib/sysusers.d/muster.conf $(DESTDIR)$(PREFIX)/lib/tmpfiles.d/muster.conf
	rm -f $(patsubst docs/man/%,$(DESTDIR)$(PREFIX)/share/man/man1/%,$(MAN1))
	rm -f $(patsubst docs/man/%,$(DESTDIR)$(PREFIX)/share/man/man8/%,$(MAN8))
	rm -rf $(DESTDIR)$(PREFIX)/share/doc/muster $(DESTDIR)$(PREFIX)/share/muster
	rm -f $(DESTDIR)$(PREFIX)/include/muster_rank.h
	rm -rf $(DESTDIR)$(PREFIX)/lib/muster

clean:
	rm -rf build build-asan

-include $(shell find $(BUILD)/obj $(BUILD)/pic $(BUILD)/cuemu -name '*.d' 2>/dev/null)
