"""Proof that the CPU tests bite, and that the quick tier bites as hard as the whole matrix:
mutants of the CPU code, each of which must fail a test of the quick tier (make test).

The mutants:
- each arithmetic operator of the op headers' math (csrc/ops/*.h: + and -, * and /, += and
  -=, *= and /=) swapped for its partner, one at a time;
- each counted loop of the CPU kernels (csrc/cpu/*.h, `for (...; i < n; ++i)`) one element
  short at its end;
- each storage kind's rounding flipped (ROUNDINGS): bf16 to nearest with ties away instead of
  to even, the remainder split with ties to even instead of away, 24-bit masters and fp8 copies
  with ties away, fp8 copies not saturated, MX scales rounded up or clamped below torchao's,
  stochastic rounding of bf16 state, 24-bit masters and 8-bit codes to nearest, 8-bit codes
  rounded down.
All of them are compiled into one build (a scratch copy of csrc/ in build-mutants/, each mutant
behind `fused_amp_mutant == id`; CPU kernels only, the portable ones and this CPU's), and
tools/mutant_plugin.py runs the tests in one pytest process, each mutant until its first failure.
Code another instruction set's kernels alone compile (`#if defined(CPU_CAPABILITY_AVX2)` on an
AVX-512 machine) gets no mutant here.

    .venv/bin/python tools/mutate_cpu_code.py [--tier quick|full] [--only TEXT] [--then-full] [--record]
                                              [--build-only]

With FUSED_AMP_CI_SELECT=changed (CI, make ci-local) it runs the mutants tools/ci_select.py
picks: those of the changed files and of files that include a changed header, those whose
recorded killing test changed, and a third of the rest by the submission counter. --record
writes each mutant's killing test to .ci/mutant-killers.txt (a run of every mutant).

--then-full runs the mutants the quick tier leaves alive against the whole matrix, to tell
whether the quick tier is the weaker net. Exit status 1 when a mutant survives.
"""
import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ci_select  # noqa: E402
import cpp_expr  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "build-mutants")
# the tests of the CPU kernels' values (README's numerics tests, and those of the ops the
# optimizers' own files test)
TESTS = ["tests/test_unscale.py", "tests/test_optim.py", "tests/test_clip.py", "tests/test_memory_modes.py",
         "tests/test_quantized_state.py", "tests/test_master24.py", "tests/test_lion.py", "tests/test_ademamix.py",
         "tests/test_muon.py", "tests/test_update_scale.py", "tests/test_grad_scaler.py", "tests/test_weight_amax.py",
         "tests/test_delayed_scaling.py", "tests/test_float8_weights.py", "tests/test_mx_weights.py"]
SWAP = {"+": "-", "-": "+", "*": "/", "/": "*", "+=": "-=", "-=": "+=", "*=": "/=", "/=": "*="}
# functions of the op headers that get no operator mutant, and why
UNMUTATED = {
    "mix32": "the hash of the random bits: another hash is as random, and the tests check the "
             "rounding's statistics (the CPU and CUDA bits are compared on a GPU)",
    "rounding_key": "the hash of the random bits (mix32)",
    "rounding_bits": "the hash of the random bits (mix32)",
    "master_rounding_key": "the hash of the random bits (mix32)",
}
# Rounding flips: (file under csrc/, the text, its mutant with {on} for the switch, what it does,
# the tests aimed at it: texts of their ids, run first). Without those, a flip that one late file's
# tests kill ran most of the tier first (the MX flips took 6 minutes each).
# The flipped branch of an op header is a macro (SWITCH below), so that its operators get no
# operator mutants of their own: those would run only with the flip on.
ROUNDINGS = [
    ("cpu/vec_bits.h", "rounded = bits + 0x7fffu + ((bits >> 16) & 1u);",
     "rounded = {on} ? bits + 0x8000u : bits + 0x7fffu + ((bits >> 16) & 1u);",
     "bf16 params and state to nearest with ties away from zero, not to even (vectors and tails)",
     ["bf16_value", "bf16"]),
    ("ops/rounding.h", "round_bits_to_bf16<W>(m, W{} + 0x8000u)",
     "round_bits_to_bf16<W>(m, {on} ? FA_MUTANT_EVEN_ADDEND(m) : W{} + 0x8000u)",
     "the remainder split with ties to even, not away from zero (scalars and vectors)",
     ["ties_away", "remainder"]),
    ("ops/rounding.h", "return 0x7fu + ((b >> 8) & 1u);", "return {on} ? W{} | 0x80u : 0x7fu + ((b >> 8) & 1u);",
     "24-bit masters to nearest with ties away from zero, not to even (scalars and vectors)",
     ["nearest_24_bit", "master24"]),
    ("ops/float8.h", "(mag + 0x7ffffu + ((mag >> 20) & 1u) - (120u << 23))",
     "(mag + ({on} ? W{} | 0x80000u : 0x7ffffu + ((mag >> 20) & 1u)) - (120u << 23))",
     "fp8 copies to nearest with ties away from zero, not to even (scalars and vectors)",
     ["writes_torchs_cast", "float8"]),
    ("ops/float8.h", "(is_nan_bits<W>(mag) || mag <= W{} + kE4m3MaxBits)",
     "(is_nan_bits<W>(mag) || {on} || mag <= W{} + kE4m3MaxBits)",
     "fp8 copies not saturated beyond 448 (torch's casts before 2.12)",
     ["writes_torchs_cast", "float8"]),
    ("ops/float8.h", "(exponent > 8u ? exponent - 8u : 0u)",
     "({on} ? FA_MUTANT_CEIL_SCALE(exponent, amax) : exponent > 8u ? exponent - 8u : 0u)",
     "fp8 MX scales of torchao's CEIL mode (the amax's power of two rounded up), not FLOOR",
     ["mx_cast_of", "mx"]),
    ("ops/float8.h", "(254u - (e > 1u ? e : 1u))", "(254u - ({on} ? e : e > 1u ? e : 1u))",
     "fp8 MX blocks of scale code 0 divided by 2^-127, not by torchao's clamp 2^-126",
     ["mx_cast_scales", "mx"]),
    ("cpu/storage_traits.h", "    if (r.stochastic) {\n      rounding_bits2",
     "    if (r.stochastic && !{on}) {\n      rounding_bits2",
     "stochastic rounding of 24-bit masters to nearest instead (vectors)",
     ["stochastic", "master24"]),
    ("cpu/storage_traits.h", "const uint32_t addend = r.stochastic\n", "const uint32_t addend = r.stochastic && !{on}\n",
     "stochastic rounding of 24-bit masters to nearest instead",
     ["stochastic", "master24"]),
    ("cpu/storage_traits.h", "if (random) return store_exact_bf16", "if (random && !{on}) return store_exact_bf16",
     "stochastic rounding of bf16 state to nearest instead (vectors)",
     ["stochastic", "bf16"]),
    ("cpu/storage_traits.h", "if (stochastic) v = ops::stochastic_round_bf16", "if (stochastic && !{on}) v = ops::stochastic_round_bf16",
     "stochastic rounding of bf16 state to nearest instead",
     ["stochastic", "bf16"]),
    ("cpu/quantized_state.h", "      const auto r = code_random<",
     "      if ({on}) return kSigned ? ops::quantize_signed(v, inv) : ops::quantize_unsigned(v, inv); "
     "const auto r = code_random<",
     "stochastic rounding of 8-bit codes to nearest instead",
     ["stochastic", "8bit", "quant"]),
    ("ops/quantize.h", "return copysign_(rint_(sqrt_(unit) * T(kSignedLevels)), x);",
     "return copysign_(FA_MUTANT_ROUND_DOWN_IF({on}, sqrt_(unit) * T(kSignedLevels)), x);",
     "signed 8-bit codes rounded down, not to nearest",
     ["8bit", "quant"]),
    ("ops/quantize.h", "return code_max_(rint_(sqrt_(unit) * T(kUnsignedLevels)), positive_(x));",
     "return code_max_(FA_MUTANT_ROUND_DOWN_IF({on}, sqrt_(unit) * T(kUnsignedLevels)), positive_(x));",
     "unsigned 8-bit codes rounded down, not to nearest",
     ["8bit", "quant"]),
]
# Mutants no test can kill, by (file, a text of their line, a text of their name): why. They are
# listed, not run. A key may name, fourth, the instruction sets where alone it is equivalent.
EQUIVALENT = {
    ("ops/unscale.h", "nonfinite = nonfinite + nonfinite_probe(x);", "+ to -"):
        "the accumulator of x * 0 is NaN once an x is inf or NaN, added or subtracted alike, and "
        "+-0 otherwise; only whether it is NaN is read",
    ("ops/float8.h", "const W subnormal = subnormal_sum - kE4m3SubnormalBiasBits;", "- to +", ("AVX512", "DEFAULT")):
        "the bias's low byte is 0, so the sum and the difference share the low byte, the code the "
        "byte stores keep here (AVX2's saturating pack tells them apart)",
}


# Mutants a test should kill and none does yet, by the same key: what is missing. Listed, not
# run, and not a failure; each is a test to write.
NOT_YET_KILLED = {
    ("cpu/quantized_state.h", "top = std::max(top, c10::bit_cast<uint32_t>(x[i]) & kMagnitude)", "one short"):
        "not yet killed: the block absmax's scalar tail; test_a_blocks_absmax_reads_its_last_element "
        "puts a block's largest value last and passes with this mutant on, which a direct run does not "
        "reproduce (absmax 0 there): to be understood",
}


def listed(file, source, what, isa):
    """Why a mutant is not run: its line in EQUIVALENT or NOT_YET_KILLED, else None."""
    for table, label in ((EQUIVALENT, "equivalent: "), (NOT_YET_KILLED, "")):
        for (f, text, name, *isas), why in table.items():
            if f == file and text in source and name in what and (not isas or isa in isas[0]):
                return label + why
    return None


# the tests run first for a mutant of a file: those whose id has one of these
KEYWORDS = {"unscale.h": ["unscale", "non_finite"], "grad_norm.h": ["clip", "norm"],
            "update_scale.h": ["update_scale", "scaler", "delayed"], "float8.h": ["float8", "mx"],
            "quantize.h": ["uint8", "quant", "8bit"], "rounding.h": ["remainder", "stochastic", "bf16", "master24"],
            "lerp.h": ["adam", "nadam", "radam"], "common.h": ["adam"], "vec_bits.h": ["bf16", "remainder", "master24"],
            "quantize4.h": ["uint4", "state4"], "quantized_state.h": ["uint8", "uint4", "quant", "state4"], "step_loops.h": ["cast_of_the_params_it_wrote", "amax_is_found"],
            "epilogues.h": ["cast_of_the_params_it_wrote", "mx_cast", "amax_is_found"],
            "storage_traits.h": ["remainder", "master24", "bf16", "stochastic"],
            "unscale_loops.h": ["unscale", "clip", "norm"]}


SWITCH = """
// tools/mutate_cpu_code.py: the mutant that is on, and the flipped branches of the rounding mutants
extern "C" int fused_amp_mutant;
#define FA_MUTANT_EVEN_ADDEND(m) (0x7fffu + (((m) >> 16) & 1u))
#define FA_MUTANT_ROUND_DOWN_IF(on, v) ((on) ? floor_(v) : rint_(v))
#define FA_MUTANT_CEIL_SCALE(e, amax) \
  ((e) + (((amax) & 0x7fffffu) != 0u) > 8u ? (e) + (((amax) & 0x7fffffu) != 0u) - 8u : 0u)
"""


@functools.lru_cache(maxsize=None)
def _source_lines(file):
    """The lines of csrc/<file> as the sources have them (read once per file)."""
    return open(os.path.join(ROOT, "csrc", file)).read().splitlines()


def on(mutant_id):
    return f"(fused_amp_mutant == {mutant_id})"


class Mutants:
    """Every mutant (id, name, file, keywords), and the texts of the files with all compiled in."""

    def __init__(self, isa):
        self.list, self.texts, self.unparsed, self.other_isa = [], {}, [], 0
        self.isa = isa

    def add(self, file, line, what, keywords=None):
        stem = os.path.basename(file)
        keywords = keywords or KEYWORDS.get(stem, [re.sub(r"\.h$", "", stem).replace("_", "")])
        source = _source_lines(file)[line - 1].strip()
        # key: what stays while the lines around it move (CI's rotation and killer record)
        self.list.append({"id": len(self.list), "name": f"{what} ({file}:{line})", "file": file,
                          "key": f"{file}|{what}|{source}", "keywords": keywords,
                          "listed": listed(file, source, what, self.isa)})
        return len(self.list) - 1


def compiled_here(text, pos, isa):
    """Whether the code at pos is compiled for the instruction set isa: the #if blocks around it
    that test a CPU_CAPABILITY_* or a CUDA macro hold (other #if blocks count as compiled)."""
    stack = []
    for m in re.finditer(r"^\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b(.*)$", text[:pos], re.M):
        kind, cond = m.group(1), m.group(2)
        if kind in ("if", "ifdef", "ifndef"):
            stack.append(_holds(kind, cond, isa))
        elif kind == "elif":
            stack[-1] = _holds("if", cond, isa)
        elif kind == "else":
            stack[-1] = None if stack[-1] is None else not stack[-1]
        else:
            stack.pop()
    return all(s is not False for s in stack)


def _holds(kind, cond, isa):
    names = re.findall(r"\w+", cond)
    if not any(n.startswith("CPU_CAPABILITY_") or "CUDA" in n or n == "FUSED_AMP_NO_FMA" for n in names):
        return None  # not about the instruction set: unknown, counted as compiled
    defined = {f"CPU_CAPABILITY_{isa}"} if isa != "DEFAULT" else {"FUSED_AMP_NO_FMA"}
    if kind == "ifdef":
        return cond.strip() in defined
    if kind == "ifndef":
        return cond.strip() not in defined
    expr = re.sub(r"defined\s*\(?\s*(\w+)\s*\)?", lambda m: str(m.group(1) in defined), cond)
    expr = expr.replace("&&", " and ").replace("||", " or ").replace("!", " not ")
    return bool(eval(expr, {}, {}))  # noqa: S307  (True/False/and/or/not only)


def function_bodies(text):
    """(name, start, end) of the body of each FA_HD function (end: its closing brace)."""
    for m in re.finditer(r"FA_HD\b[^;{]*?(\w+)\s*\(", text):
        depth, i = 0, m.end() - 1
        while True:  # the parameter list
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        brace = text.index("{", i)
        if text[i:brace].strip() not in ("", "const"):
            continue
        depth, j = 0, brace
        while True:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
            if depth == 0:
                break
        yield m.group(1), brace + 1, j - 1


def expressions(text, start, end):
    """(start, end) of each expression of the statements in text[start:end]: conditions of if
    (not if constexpr) and of for, returns, assignments, and initializers of declarations (a
    for's own among them)."""
    tokens = cpp_expr.tokenize(text, start, end)
    i = 0

    def close_of(j, open_, close):
        depth = 0
        while True:
            depth += {open_: 1, close: -1}.get(tokens[j][1], 0)
            if depth == 0:
                return j
            j += 1

    def statement_end(j):
        depth = 0
        while not (tokens[j][1] == ";" and depth == 0):
            depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(tokens[j][1], 0)
            j += 1
        return j

    while i < len(tokens):
        word = tokens[i][1]
        if word in ("{", "}", "else", ";"):
            i += 1
        elif word == "if":
            if tokens[i + 1][1] == "constexpr":
                i = close_of(i + 2, "(", ")") + 1
                continue
            close = close_of(i + 1, "(", ")")
            yield tokens[i + 2][2], tokens[close][2]
            i = close + 1
        elif word == "for":  # its declaration's initializers and its condition; the body follows
            close = close_of(i + 1, "(", ")")
            first_semi = statement_end(i + 2)
            yield from initializers(tokens, i + 2, first_semi)
            second_semi = statement_end(first_semi + 1)
            yield tokens[first_semi + 1][2], tokens[second_semi][2]
            i = close + 1
        else:
            semi = statement_end(i)
            first = i + 1 if word == "return" else i
            if first < semi:
                stmt_start, stmt_end = tokens[first][2], tokens[semi][2]
                try:
                    cpp_expr.parse(text, stmt_start, stmt_end)
                    yield stmt_start, stmt_end
                except cpp_expr.ParseError:  # a declaration: the initializer of each name
                    yield from initializers(tokens, first, semi)
            i = semi + 1


def initializers(tokens, first, last):
    """(start, end) of each `= initializer` of the declaration tokens[first:last]."""
    depth, start = 0, None
    for k in range(first, last + 1):
        word = tokens[k][1]
        if depth == 0 and (word in (",", ";") or k == last) and start is not None:
            yield start, tokens[k][2]
            start = None
        elif depth == 0 and word == "=":
            start = tokens[k + 1][2]
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(word, 0)


def emit(text, node, mutants, file, function):
    """The text of node with a mutant wrapped around each operator in SWAP."""
    at = node.start
    children = [emit(text, c, mutants, file, function) for c in node.children]
    pieces = []
    for child, child_text in zip(node.children, children):
        pieces.append(text[at:child.start])
        pieces.append(child_text)
        at = child.end
    pieces.append(text[at:node.end])
    original = "".join(pieces)
    if node.op not in SWAP or node.kind not in ("binary", "assign"):
        return original
    line = text.count("\n", 0, node.op_at) + 1
    mutant = mutants.add(file, line, f"{node.op} to {SWAP[node.op]} in {function}")
    # the operator sits between the children: swap it in the text between them
    left, right = node.children
    middle = text[left.end:right.start].replace(node.op, SWAP[node.op], 1)
    swapped = children[0] + middle + children[1]
    swapped = text[node.start:left.start] + swapped + text[right.end:node.end]
    return f"({on(mutant)} ? ({swapped}) : ({original}))"


def mutate_operators(text, file, mutants):
    """text with a mutant around each swappable operator of its FA_HD functions."""
    edits = []
    for function, start, end in function_bodies(text):
        if function in UNMUTATED:
            continue
        for e_start, e_end in expressions(text, start, end):
            if not compiled_here(text, e_start, mutants.isa):
                mutants.other_isa += 1
                continue
            try:
                node = cpp_expr.parse(text, e_start, e_end)
            except cpp_expr.ParseError as e:
                mutants.unparsed.append(f"{file}:{text.count(chr(10), 0, e_start) + 1} ({function}): {e}")
                continue
            if any(n.op in SWAP and n.kind in ("binary", "assign") for n in node.walk()):
                edits.append((e_start, e_end, emit(text, node, mutants, file, function)))
    for e_start, e_end, new in sorted(edits, reverse=True):
        text = text[:e_start] + new + text[e_end:]
    return text


def mutate_loops(text, file, mutants):
    """Each `for (...; i < n; ++i)` one element short, where compiled for this instruction set."""
    edits = []
    for m in re.finditer(r"for \(([^;]*);\s*([\w.]+) < ([^;]+?);\s*\+\+\2\)", text):
        if not compiled_here(text, m.start(), mutants.isa):
            mutants.other_isa += 1
            continue
        line = text.count("\n", 0, m.start()) + 1
        mutant = mutants.add(file, line, f"loop `{m.group(2)} < {m.group(3)}` one short")
        edits.append((m.start(3), m.end(3), f"({m.group(3)}) - {on(mutant)}"))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def generate(isa, only=""):
    """The mutants for instruction set isa, and csrc/ with all of them compiled in, as {path: text}."""
    mutants = Mutants(isa)
    csrc = os.path.join(ROOT, "csrc")
    texts = {f"{d}/{name}": open(os.path.join(csrc, d, name)).read()
             for d in ("ops", "cpu") for name in sorted(os.listdir(os.path.join(csrc, d))) if name.endswith(".h")}
    # the rounding flips first, on the sources as they are (a name stands for each switch until
    # the operators and loops are done)
    for file, old, new, what, keywords in ROUNDINGS:
        text = texts[file]
        assert text.count(old) == 1, f"{file}: the text of rounding mutant '{what}' is not there once"
        mutant = mutants.add(file, text[:text.index(old)].count("\n") + 1, what, keywords)
        texts[file] = text.replace(old, new.replace("{on}", f"FA_MUTANT_{mutant}"))
    for path, text in texts.items():
        mutate = mutate_operators if path.startswith("ops/") else mutate_loops
        texts[path] = re.sub(r"FA_MUTANT_(\d+)", lambda m: on(m.group(1)), mutate(text, path, mutants))
    # the switch: declared before any op (common.h comes first), defined once, set from Python
    texts["ops/common.h"] = texts["ops/common.h"].replace("#include <cmath>\n", "#include <cmath>\n" + SWITCH, 1)
    texts["mutant_switch.cpp"] = (
        "#include <cstdlib>\n// the mutant compiled in that is on (-1: none); FUSED_AMP_MUTANT for child processes\n"
        "extern \"C\" __attribute__((visibility(\"default\"))) int fused_amp_mutant =\n"
        "    std::getenv(\"FUSED_AMP_MUTANT\") ? std::atoi(std::getenv(\"FUSED_AMP_MUTANT\")) : -1;\n")
    mutants.texts = texts
    if only:
        mutants.list = [m for m in mutants.list if only in m["name"]]
    return mutants


def build(texts, python):
    """The CPU-only extension with every mutant, in OUT/lib (ninja keeps OUT/tmp: a rebuild
    compiles what changed)."""
    src = os.path.join(OUT, "src")
    csrc = os.path.join(ROOT, "csrc")
    wanted = {os.path.relpath(os.path.join(d, f), csrc) for d, _, files in os.walk(csrc) for f in files}
    wanted = {p: texts.get(p) or open(os.path.join(csrc, p)).read() for p in wanted | set(texts)}
    if os.path.exists(os.path.join(src, "csrc")):
        for d, _, files in os.walk(os.path.join(src, "csrc")):
            for f in files:
                if os.path.relpath(os.path.join(d, f), os.path.join(src, "csrc")) not in wanted:
                    os.remove(os.path.join(d, f))
    for path, text in wanted.items():  # only what changed is written: ninja rebuilds only that
        target = os.path.join(src, "csrc", path)
        if not os.path.exists(target) or open(target).read() != text:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as f:
                f.write(text)
    shutil.copy(os.path.join(ROOT, "setup.py"), src)
    lib = os.path.join(OUT, "lib")
    shutil.rmtree(os.path.join(lib, "fused_amp"), ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "fused_amp"), os.path.join(lib, "fused_amp"),
                    ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    # CPU kernels only, and of those the portable ones and this CPU's own (the mutants' isa)
    env = dict(os.environ, FUSED_AMP_CUDA="0", FUSED_AMP_CPU_KERNELS="native",
               MAX_JOBS=os.environ.get("MAX_JOBS", str(os.cpu_count())))
    t0 = time.time()
    with open(os.path.join(OUT, "build.log"), "w") as log:
        done = subprocess.run([python, "setup.py", "build_ext", "--build-lib", lib, "--build-temp",
                               os.path.join(OUT, "tmp")], cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        print(open(os.path.join(OUT, "build.log")).read()[-6000:])
        raise SystemExit(f"the mutant build failed: see {OUT}/build.log")
    return time.time() - t0


def run(mutants, tier, python, timeout):
    """{id: (killed_by or None, seconds)} of each mutant, the tests of TESTS at tier; a crashed
    or hung process kills the mutant it ran, and the run goes on from the next one."""
    lib = os.path.join(OUT, "lib")
    results, todo = {}, list(mutants)
    progress_path = os.path.join(OUT, f"progress-{tier}.jsonl")
    env = dict(os.environ, FUSED_AMP_TEST_TIER=tier, PYTHONPATH=os.pathsep.join(
        [lib, os.path.dirname(os.path.abspath(__file__))]), FUSED_AMP_MUTANT="-1")
    while todo:
        with open(os.path.join(OUT, "mutants.json"), "w") as f:
            json.dump(todo, f)
        open(progress_path, "w").close()
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "mutant_plugin", "--rootdir", ROOT,
               "--mutants", os.path.join(OUT, "mutants.json"), "--mutant-progress", progress_path,
               "-W", "ignore::pytest.PytestUnraisableExceptionWarning"] + [os.path.join(ROOT, t) for t in TESTS]
        proc = subprocess.Popen(cmd, cwd=lib, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        seen, last_change, started = 0, time.time(), None
        while proc.poll() is None:
            time.sleep(1)
            lines = open(progress_path).read().splitlines()
            if len(lines) != seen:
                seen, last_change = len(lines), time.time()
            elif started is not None and time.time() - last_change > timeout:
                os.killpg(proc.pid, 9)
        out = proc.stdout.read().decode(errors="replace")
        events = [json.loads(x) for x in open(progress_path).read().splitlines()]
        started = None
        for e in events:
            if "start" in e:
                started = e["start"]
            else:
                results[e["id"]] = (e["killed_by"], e["seconds"])
                started = None
        if not events or "without a mutant" in out:
            print(out[-6000:])
            raise SystemExit("the tests did not start, or a test fails without a mutant")
        if started is not None:
            how = "hang" if proc.returncode == -9 else f"crash (exit {proc.returncode})"
            results[started] = (how, timeout if how == "hang" else 0.0)
        elif proc.returncode not in (0, 1):
            print(out[-6000:])
            raise SystemExit(f"pytest exited with {proc.returncode} between mutants")
        todo = [m for m in todo if m["id"] not in results]
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tier", default="quick", choices=["quick", "full"])
    parser.add_argument("--then-full", action="store_true", help="run the quick tier's survivors on the full one")
    parser.add_argument("--only", default="", help="the mutants whose name has this text")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--timeout", type=float, default=600, help="seconds a mutant may run without a result")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--record", action="store_true", help="record each mutant's killer (.ci/mutant-killers.txt)")
    parser.add_argument("--build-only", action="store_true", help="the build alone (.ci/run's set-up)")
    args = parser.parse_args()
    isa = subprocess.run([args.python, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                         capture_output=True, text=True, check=True).stdout.strip()
    mutants = generate(isa, args.only)
    print(f"{len(mutants.list)} mutants of the CPU code for {isa}; {mutants.other_isa} sites compiled for "
          f"other instruction sets only get none")
    if mutants.unparsed:
        print("expressions not read (no mutants there):\n  " + "\n  ".join(mutants.unparsed))
    if args.list:
        print("\n".join(m["name"] for m in mutants.list))
        return 0
    selection = ci_select.MutantSelection(ci_select.killers_recorded("cpu"))
    why = {m["id"]: selection.why(m["file"], m["key"]) for m in mutants.list}
    chosen = [m for m in mutants.list if not m["listed"] and why[m["id"]]]
    if args.record and len(chosen) + sum(bool(m["listed"]) for m in mutants.list) < len(mutants.list):
        raise SystemExit("--record needs every mutant: run it without FUSED_AMP_CI_SELECT=changed or --only")
    if not chosen and not args.build_only:
        print(f"CPU mutants: {len(mutants.list)}, 0 ran, 0 killed (none chosen: no build)")
        return 0
    os.makedirs(OUT, exist_ok=True)
    print(f"build with every mutant: {build(mutants.texts, args.python):.0f} s", flush=True)
    if args.build_only:
        return 0
    t0 = time.time()
    results = run(chosen, args.tier, args.python, args.timeout) if chosen else {}
    print(f"{args.tier} tier of {' '.join(os.path.basename(t) for t in TESTS)}: {time.time() - t0:.0f} s\n")
    print("| mutant | why it ran | failed test | s |\n|---|---|---|---|")
    for m in mutants.list:
        if m["listed"]:
            print(f"| {m['name']} | listed | {m['listed']} | |")
        elif m["id"] in results:
            killer, seconds = results[m["id"]]
            print(f"| {m['name']} | {why[m['id']]} | {(killer or 'SURVIVED').split('::', 1)[-1]} | {seconds:.1f} |")
    survivors = [m for m in chosen if results[m["id"]][0] is None]
    n_listed = sum(bool(m["listed"]) for m in mutants.list)
    print(f"\nCPU mutants: {len(mutants.list)}, {n_listed} listed as equivalent or not yet killed, "
          f"{len(chosen)} ran ({', '.join(f'{n} {w}' for w, n in Counter(why[m['id']] for m in chosen).most_common())}), "
          f"{len(chosen) - len(survivors)} killed by the {args.tier} tier")
    if args.record:
        ci_select.record_killers("cpu", {m["key"]: results[m["id"]][0] for m in chosen})
    if survivors and args.then_full and args.tier == "quick":
        full = run(survivors, "full", args.python, args.timeout)
        for m in survivors:
            print(f"full tier: {m['name']}: {(full[m['id']][0] or 'SURVIVED').split('::', 1)[-1]}")
        print(f"{sum(full[m['id']][0] is not None for m in survivors)} of them killed by the full tier")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
