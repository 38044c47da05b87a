# offgraph: the two commands of the README, and the builds CI uses.
#   make run    builds everything and runs the main job
#   make test   builds everything and runs every test
# Missing Debian packages are installed with apt-get on the way.

BUILD      ?= build
SAN_BUILD  ?= build-sanitize
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
CLANG_BUILD ?= build-clang
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build build-clang run test test-sanitize test-tsan fuzz fuzz-replay bench install clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

run: build
	@bash scripts/main-job.sh $(BUILD)

test: build
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The same tests built with AddressSanitizer and UndefinedBehaviorSanitizer
# (20 injected KV faults and 20 never-read streams there, not 100: requests
# are ten times slower).
test-sanitize: deps
	@cmake -S . -B $(SAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOG_SANITIZE=address,undefined -DOG_CUDA=OFF >/dev/null
	@cmake --build $(SAN_BUILD) -j $(JOBS)
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 OG_FAULTS_COUNT=20 OG_FLOOD_NOREAD=20 \
	  ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS)

# The tests that share one model between threads (test_threads, test_batch)
# and the thread pool's (test_threadpool: concurrent and nested callers,
# random delays), built with ThreadSanitizer (gcc, CPU only); any report
# fails the run.
TSAN_TESTS = test_threads test_batch test_threadpool test_engine
test-tsan: deps
	@CC=gcc cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOG_SANITIZE=thread -DOG_CUDA=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target $(TSAN_TESTS)
	@TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  ctest --test-dir $(TSAN_BUILD) --output-on-failure -j $(JOBS) -R '^test_(threads|batch|threadpool|engine)$$'

# Everything (library, tool, tests, benchmarks, the CUDA back end's C files
# when nvcc is found) compiled with clang, warnings as errors: the code must
# build warning-free under both gcc and clang. Builds only; CI runs it.
build-clang:
	@bash scripts/install-deps.sh --fuzz
	@CC=clang cmake -S . -B $(CLANG_BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	@cmake --build $(CLANG_BUILD) -j $(JOBS)

# libFuzzer harnesses (clang). FUZZ_SECONDS per harness, after each has
# replayed its corpus; fails on a build error, a crash or a harness that ran
# nothing (scripts/fuzz.sh).
FUZZ_SECONDS ?= 60
fuzz:
	@bash scripts/install-deps.sh --fuzz
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DOG_FUZZ=ON -DOG_CUDA=OFF >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)
	@bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

# Installs into PREFIX (default /usr/local), staged under DESTDIR when set:
# lib/liboffgraph.so.<major> (and .a), include/offgraph.h, bin/offgraph,
# lib/pkgconfig/offgraph.pc and lib/cmake/offgraph (find_package(offgraph)).
PREFIX ?= /usr/local
install: build
	@DESTDIR="$(DESTDIR)" cmake --install $(BUILD) --prefix "$(PREFIX)"

bench: build
	@ls $(BUILD)/bench_* 2>/dev/null || true

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD) $(CLANG_BUILD)
