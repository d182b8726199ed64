# ctune build. `make demo` and `make test` install what is missing first, then build.
# Out-of-tree builds: `make B=/tmp/b BIN=/tmp/b/bin ...` keeps objects and binaries apart.
B   ?= build
BIN ?= bin
CC  ?= gcc
OPT ?= -O2 -march=native

MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)

# clang warns when it cannot vectorize an `omp simd` loop (at -O1 under asan): not an error
CLANG_FLAGS := $(if $(findstring clang,$(shell $(CC) --version 2>/dev/null)),-Wno-pass-failed)

# Vectorization: at -O2 GCC 12 vectorizes almost no loop whose length is not a constant
# (the "very cheap" cost model), and -ftrapping-math / -fmath-errno keep rounding,
# conversions and sqrtf out of vector code. ctune never enables FP traps nor reads errno
# after math calls; NaN and infinity semantics are kept (this is not -ffast-math).
VEC_FLAGS := $(if $(CLANG_FLAGS),,-fvect-cost-model=dynamic) -fno-trapping-math -fno-math-errno

CFLAGS_ALL = $(OPT) $(VEC_FLAGS) $(CLANG_FLAGS) -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -fopenmp-simd \
             -Ibase -Itext -Inn -Idata -Iinfer -Icommon -Iapp -I. $(MPI_CFLAGS) -MMD -MP $(CFLAGS) $(EXTRA_CFLAGS)
LDLIBS_ALL = -lopenblas -ldnnl -lgomp -lyaml -ljansson -lcurl -lpcre2-8 -lz $(MPI_LIBS) -lm -pthread $(LDFLAGS)

# the library's floors (tests/layers.sh): base < text, nn < data, infer < common, and app
# (what the executables share, and the only floor that may exit) above them
COMMON_SRC  := $(wildcard base/*.c text/*.c nn/*.c data/*.c infer/*.c common/*.c app/*.c)
# a trainer's own modules (dpo/loss.c, ...) go in the library too, so tests can reach them
TRAINER_SRC := $(filter-out %/main.c,$(wildcard sft/*.c dpo/*.c grpo/*.c distill/*.c reward/*.c))
LIB_OBJ     := $(COMMON_SRC:%.c=$(B)/%.o) $(TRAINER_SRC:%.c=$(B)/%.o)
LIB         := $(B)/libctune.a

TRAINERS := $(patsubst %/main.c,%,$(wildcard sft/main.c dpo/main.c grpo/main.c distill/main.c sampler/main.c reward/main.c))
# a tool is one file tools/NAME.c, or a folder of files tools/ckpt/ (bin/ctune-ckpt)
TOOLS    := $(patsubst tools/%.c,%,$(wildcard tools/*.c)) ctune-ckpt
CKPT_SRC := $(wildcard tools/ckpt/*.c)
PROGS    := $(TRAINERS:%=$(BIN)/%) $(TOOLS:%=$(BIN)/%)
TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c))

.PHONY: all deps test test-run demo demo-run bench bench-run asan valgrind install clean
.DEFAULT_GOAL := all
.SECONDARY:  # keep objects: they are intermediate files of the chained rules
NPROC := $(shell nproc 2>/dev/null || echo 2)

all: $(PROGS) $(TESTS)

# Top-level entry points install dependencies first, then re-enter make so that the
# compiler flags above are computed with mpicc present.
deps:
	@sh scripts/install-deps.sh

test: deps
	@sh scripts/install-deps.sh test
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory test-run

test-run: all
	@sh tests/run.sh $(B) $(BIN)

demo: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory demo-run

# DEMO=quick: every stage with a tenth of the data and a few steps (what `make test` runs)
demo-run: all
	@sh scripts/demo.sh $(BIN) $(DEMO)

bench: deps
	@$(MAKE) --no-print-directory -j$(NPROC) all
	@$(MAKE) --no-print-directory bench-run

bench-run: all
	@sh scripts/bench.sh $(B) $(BIN)

# Unit tests under AddressSanitizer + UBSan, in a build tree of their own.
ASAN = B=build-asan BIN=build-asan/bin LDFLAGS="-fsanitize=address,undefined" \
       OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all"
asan: deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(ASAN) all
	@CT_SKIP_SH=1 $(MAKE) --no-print-directory $(ASAN) test-run

# Unit tests under valgrind's memcheck. Valgrind 3.19 cannot run AVX-512 code, so this
# tree is built for AVX2 (OpenBLAS picks its kernel from the CPUID valgrind shows).
VALGRIND = B=build-vg BIN=build-vg/bin OPT="-O2 -g -mavx2 -mfma"
valgrind: deps
	@$(MAKE) --no-print-directory -j$(NPROC) $(VALGRIND) all
	@CT_SKIP_SH=1 CT_WRAP="valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite" \
	  $(MAKE) --no-print-directory $(VALGRIND) test-run

# Fuzzing: libFuzzer targets (fuzz/fuzz_*.c) built by clang with ASan + UBSan in a tree of
# their own, from only the library sources they reach. `make fuzz` runs each FUZZ_RUNS
# times; tests/fuzz_smoke.sh (in `make test`) builds them with fuzz-build and runs each briefly.
FUZZ_B    := build-fuzz
FUZZ_RUNS ?= 1000000
FUZZ_TARGETS := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_SRC  := $(wildcard base/*.c text/*.c) nn/safetensors.c nn/gguf_read.c nn/model.c nn/hf.c nn/hfjson.c nn/kernels.c nn/quant.c \
             nn/thin.c nn/matmul.c nn/optim.c $(wildcard common/config*.c) data/data.c data/jsonl.c data/prefs.c \
             data/prompts.c data/rowmap.c distill/topk.c common/calculator.c
FUZZ_SAN  := -fsanitize=address,undefined -fno-sanitize-recover=all
FUZZ = B=$(FUZZ_B) CC=clang OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link $(FUZZ_SAN)"
.PHONY: fuzz fuzz-build
fuzz: deps
	@sh scripts/install-deps.sh fuzz
	@$(MAKE) --no-print-directory fuzz-build
	@sh fuzz/run.sh $(FUZZ_B) -runs=$(FUZZ_RUNS)

fuzz-build:
	@$(MAKE) --no-print-directory -j$(NPROC) $(FUZZ) $(FUZZ_TARGETS:%=$(FUZZ_B)/fuzz/%)

$(B)/libctune-fuzz.a: $(FUZZ_SRC:%.c=$(B)/%.o)
	rm -f $@ && ar rcs $@ $^

$(B)/fuzz/fuzz_%: $(B)/fuzz/fuzz_%.o $(B)/libctune-fuzz.a
	$(CC) $(OPT) -fsanitize=fuzzer $< $(B)/libctune-fuzz.a -o $@ $(LDLIBS_ALL)

PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf build build-asan build-vg bin

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/sampler: $(B)/sampler/main.o $(B)/sampler/bench.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS_ALL)

$(BIN)/ctune-ckpt: $(CKPT_SRC:%.c=$(B)/%.o) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $^ -o $@ $(LDLIBS_ALL)

$(BIN)/%: $(B)/%/main.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $< $(LIB) -o $@ $(LDLIBS_ALL)

$(BIN)/%: $(B)/tools/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $< $(LIB) -o $@ $(LDLIBS_ALL)

$(B)/tests/%: $(B)/tests/%.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) $< $(LIB) -o $@ $(LDLIBS_ALL)

-include $(shell find $(B) -name '*.d' 2>/dev/null)
