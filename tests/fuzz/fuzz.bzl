"""topiary_fuzzer: a libFuzzer harness as two targets.

NAME: the fuzzer itself, linked with libFuzzer's main. Build it with --config=fuzz (clang,
AddressSanitizer, UndefinedBehaviorSanitizer; see scripts/fuzz.sh); tagged manual, so `//...`
skips it in ordinary builds.
NAME_replay: a test in every build that runs the harness on its seed corpus
(corpus/CORPUS/) and on every regression input under regressions/ (all harnesses get all of
them: an input is harmless to the others), through replay_main.cc.
"""

def topiary_fuzzer(name, corpus, deps):
    native.cc_binary(
        name = name,
        srcs = [name + ".cc"],
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        testonly = True,
        deps = deps,
    )
    native.cc_test(
        name = name + "_replay",
        size = "small",
        srcs = [name + ".cc", "replay_main.cc"],
        args = ["tests/fuzz/corpus/" + corpus, "tests/fuzz/regressions"],
        data = native.glob(["corpus/" + corpus + "/**", "regressions/**"]),
        deps = deps,
    )
