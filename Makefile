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

CFLAGS_ALL = $(OPT) $(CLANG_FLAGS) -std=c11 -Wall -Wextra -Werror -D_GNU_SOURCE -pthread -fopenmp-simd \
             -Icommon -Isampler $(MPI_CFLAGS) -MMD -MP $(CFLAGS) $(EXTRA_CFLAGS)
LDLIBS_ALL = -lopenblas -lyaml -ljansson -lcurl $(MPI_LIBS) -lm -pthread $(LDFLAGS)

COMMON_SRC  := $(wildcard common/*.c)
SAMPLER_SRC := $(filter-out sampler/main.c,$(wildcard sampler/*.c))
LIB_OBJ     := $(COMMON_SRC:%.c=$(B)/%.o) $(SAMPLER_SRC:%.c=$(B)/%.o)
LIB         := $(B)/libctune.a

TRAINERS := $(patsubst %/main.c,%,$(wildcard sft/main.c dpo/main.c grpo/main.c distill/main.c sampler/main.c))
TOOLS    := $(patsubst tools/%.c,%,$(wildcard tools/*.c))
PROGS    := $(TRAINERS:%=$(BIN)/%) $(TOOLS:%=$(BIN)/%)
TESTS    := $(patsubst tests/%.c,$(B)/tests/%,$(wildcard tests/test_*.c))

.PHONY: all deps test test-run demo demo-run bench bench-run asan install clean
.DEFAULT_GOAL := all

all: $(PROGS) $(TESTS)

# Top-level entry points install dependencies first, then re-enter make so that the
# compiler flags above are computed with mpicc present.
deps:
	@sh scripts/install-deps.sh

test: deps
	@$(MAKE) --no-print-directory test-run

test-run: all
	@sh tests/run.sh $(B) $(BIN)

demo: deps
	@$(MAKE) --no-print-directory demo-run

demo-run: all
	@sh scripts/demo.sh $(BIN)

bench: deps
	@$(MAKE) --no-print-directory bench-run

bench-run: all
	@sh scripts/bench.sh $(B) $(BIN)

# Unit tests under AddressSanitizer + UBSan, in a build tree of their own.
asan: deps
	@$(MAKE) --no-print-directory B=build-asan BIN=build-asan/bin \
	  OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
	  LDFLAGS="-fsanitize=address,undefined" test-run

PREFIX ?= /usr/local
install: all
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 755 $(PROGS) $(DESTDIR)$(PREFIX)/bin/

clean:
	rm -rf build build-asan bin

$(B)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

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
