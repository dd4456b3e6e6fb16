# tests/cuemu: CUDA, cuBLAS and NCCL emulated on the CPU (tests/cuemu/README.md).
# The GPU path's own source (worker/train/gpu/*.cu, gpu_train.c, the NCCL backend)
# is compiled against cuemu's headers by the host compiler and linked with
# cuemu instead of the CUDA libraries: CI runs it, with or without a CUDA
# toolkit. Objects go to $(BUILD)/cuemu/ so they never mix with the real ones.
CUEMU_SRCS := tests/cuemu/cuemu_runtime.cc tests/cuemu/cuemu_kernel.cc tests/cuemu/cuemu_blas.cc \
	tests/cuemu/cuemu_nccl.cc
CUEMU_DEFS := -Itests/cuemu/include -Itests/cuemu -DMUSTER_CUEMU -DMUSTER_HAVE_CUDA -DMUSTER_HAVE_NCCL
CUEMU_CXXFLAGS = -std=c++17 -O2 -g -Wall -Wextra -Werror -I. $(CUEMU_DEFS) $(SAN) $(CXXFLAGS)
cuemu_obj = $(patsubst %,$(BUILD)/cuemu/obj/%.o,$(basename $(1)))

# C sources that see CUDA or NCCL headers, built again for cuemu.
CUEMU_C_SRCS := $(GPU_SRCS) $(COMM_NCCL_SRC)
CUEMU_OBJS := $(call cuemu_obj,$(CUEMU_SRCS) $(GPU_CU_SRCS) $(CUEMU_C_SRCS)) \
	$(call obj,$(TRAIN_SRCS)) $(LIBMUSTER)
CUEMU_LINK = $(CXX) $(ALL_LDFLAGS) -fopenmp -o $@ $^ $(BLAS_LIBS) $(LIBS_JSON) -lpthread -lm

$(BUILD)/cuemu/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX     $<")
	$(Q)$(CXX) $(CUEMU_CXXFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/cuemu/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CXX     $< (cuemu)")
	$(Q)$(CXX) $(CUEMU_CXXFLAGS) -x c++ -MMD -MP -c -o $@ $<

$(BUILD)/cuemu/obj/%.o: %.c
	@mkdir -p $(dir $@)
	@$(if $(Q),echo "  CC      $< (cuemu)")
	$(Q)$(CC) $(ALL_CFLAGS) -fopenmp $(CUEMU_DEFS) -MMD -MP -c -o $@ $<

# muster-train whose --device gpu runs on cuemu; the GPU check on cuemu. Its
# GPU path is linked in (MUSTER_GPU_STATIC), not a module: the same entry
# table, without dlopen.
$(call cuemu_obj,worker/train/gpu/gpu_load.c): CUEMU_DEFS += -DMUSTER_GPU_STATIC
$(BUILD)/cuemu/muster-train: $(call cuemu_obj,$(TRAIN_MAIN) worker/train/gpu/gpu_load.c) $(CUEMU_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CUEMU_LINK)

$(BUILD)/cuemu/gpu-check: $(call cuemu_obj,tests/gpu-check.c) $(CUEMU_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CUEMU_LINK)

CUEMU_BINS := $(BUILD)/cuemu/muster-train $(BUILD)/cuemu/gpu-check

# ZeRO-3 of the GPU path across ranks that are threads (tests/cuemu/zero-world.c).
$(BUILD)/cuemu/zero-world: $(call cuemu_obj,tests/cuemu/zero-world.c) $(CUEMU_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CUEMU_LINK)

CUEMU_BINS += $(BUILD)/cuemu/zero-world

# The communicator under failures (tests/cuemu/gpu-faults.c).
$(BUILD)/cuemu/gpu-faults: $(call cuemu_obj,tests/cuemu/gpu-faults.c) $(CUEMU_OBJS)
	@$(if $(Q),echo "  LD      $@")
	$(Q)$(CUEMU_LINK)

CUEMU_BINS += $(BUILD)/cuemu/gpu-faults

# The same program under ASan+UBSan and under TSan, for its abort race: the
# race runs no kernel (cuemu's fibers are what sanitizers cannot follow), so
# the GPU path's communicator code and cuemu are built instrumented here,
# each in its own object directory; the CPU code they call is linked as is.
comma := ,
GPU_FAULTS_SRCS := tests/cuemu/gpu-faults.c $(CUEMU_SRCS) $(GPU_CU_SRCS) $(COMM_NCCL_SRC)
define gpu_faults_san
$(BUILD)/cuemu-$(1)/obj/%.o: %.c
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  CC      $$< (cuemu, $(1))")
	$$(Q)$$(CC) $$(ALL_CFLAGS) $(2) -fopenmp $$(CUEMU_DEFS) -MMD -MP -c -o $$@ $$<
$(BUILD)/cuemu-$(1)/obj/%.o: %.cc
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  CXX     $$< ($(1))")
	$$(Q)$$(CXX) $$(CUEMU_CXXFLAGS) $(2) -MMD -MP -c -o $$@ $$<
$(BUILD)/cuemu-$(1)/obj/%.o: %.cu
	@mkdir -p $$(dir $$@)
	@$$(if $$(Q),echo "  CXX     $$< (cuemu, $(1))")
	$$(Q)$$(CXX) $$(CUEMU_CXXFLAGS) $(2) -x c++ -MMD -MP -c -o $$@ $$<
$(BUILD)/cuemu/gpu-faults-$(1): $(patsubst %,$(BUILD)/cuemu-$(1)/obj/%.o,$(basename $(GPU_FAULTS_SRCS))) \
		$(call obj,$(TRAIN_SRCS)) $(LIBMUSTER)
	@$$(if $$(Q),echo "  LD      $$@")
	$$(Q)$$(CXX) $$(ALL_LDFLAGS) $(2) -fopenmp -o $$@ $$^ $$(BLAS_LIBS) $$(LIBS_JSON) -lpthread -lm
CUEMU_BINS += $(BUILD)/cuemu/gpu-faults-$(1)
endef
$(eval $(call gpu_faults_san,asan,-fsanitize=address$(comma)undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined))
$(eval $(call gpu_faults_san,tsan,-fsanitize=thread))
