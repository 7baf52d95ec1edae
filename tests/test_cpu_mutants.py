"""tools/mutate_cpu_code.py finds what it should: each operator with its own operands, every
expression of the op headers read, the rounding flips' texts still in the sources."""
import operator
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import cpp_expr  # noqa: E402
import mutate_cpu_code  # noqa: E402


class _Mutants(mutate_cpu_code.Mutants):
    def add(self, file, line, what):
        self.list.append(what)
        return len(self.list) - 1


def _mutate(expression):
    mutants = _Mutants("AVX512")
    return mutate_cpu_code.emit(expression, cpp_expr.parse(expression, 0, len(expression)), mutants, "f.h", "f"), mutants


def _resolve(text, node, active):
    """The text of a mutated expression with mutant `active` on (its ?: switches resolved)."""
    if node.kind == "?:" and text[node.children[0].start:node.children[0].end].startswith("(fused_amp_mutant =="):
        chosen = str(active) == text[node.children[0].start:node.children[0].end].split("==")[1].strip(" )")
        return _resolve(text, node.children[1 if chosen else 2], active)
    pieces, at = [], node.start
    for child in node.children:
        pieces += [text[at:child.start], _resolve(text, child, active)]
        at = child.end
    return "".join(pieces) + text[at:node.end]


def _bare(text):
    return text.replace("(", "").replace(")", "").replace(" ", "")


@pytest.mark.parametrize("expression,swapped", [
    ("a + b * c", ["a + b / c", "a - b * c"]),
    ("a - b - c", ["a + b - c", "a - b + c"]),
    ("param - T(c.step_size) * exp_avg / denom", ["param - T(c.step_size) / exp_avg / denom",
                                                  "param - T(c.step_size) * exp_avg * denom",
                                                  "param + T(c.step_size) * exp_avg / denom"]),
    ("x > 0.f ? a * b : -a", ["x > 0.f ? a / b : -a"]),
    ("static_cast<float>(1.0 - lr * h.wd)", ["static_cast<float>(1.0 - lr / h.wd)",
                                             "static_cast<float>(1.0 + lr * h.wd)"]),
    ("s += 1", ["s -= 1"]),
    # the signs of literals' exponents, hex floats' too, are no operators
    ("x * 0x1p-20f + 1e-5f", ["x / 0x1p-20f + 1e-5f", "x * 0x1p-20f - 1e-5f"]),
])
def test_each_operator_is_swapped_between_its_own_operands(expression, swapped):
    text, mutants = _mutate(expression)
    node = cpp_expr.parse(text, 0, len(text))
    assert len(mutants.list) == len(swapped)
    assert _bare(_resolve(text, node, -1)) == _bare(expression)
    for k, want in enumerate(swapped):
        assert _bare(_resolve(text, node, k)) == _bare(want), (k, want, text)


@pytest.mark.parametrize("expression", ["a & b", "x << 2", "f(a, b)[0].c", "!flag && x != y"])
def test_no_mutant_where_no_arithmetic_operator(expression):
    text, mutants = _mutate(expression)
    assert text == expression and not mutants.list


def _evaluate(text, node, env):
    """The value of a parsed expression of names, numbers, + - * / ==, parentheses and ?:."""
    kids = [lambda c=c: _evaluate(text, c, env) for c in node.children]
    if node.kind == "literal":
        return float(text[node.start:node.end].rstrip("fFuU"))
    if node.kind == "name":
        return env[text[node.start:node.end]]
    if node.kind == "paren":
        return kids[0]()
    if node.kind == "?:":
        return kids[1]() if kids[0]() else kids[2]()
    a, b = kids[0](), kids[1]()
    return {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
            "==": operator.eq}[node.op](a, b)


def test_each_mutant_alone_changes_the_value_and_none_on_keeps_it():
    expression = "(a + b) * c - d / (e - f) + g * h"
    text, mutants = _mutate(expression)
    values = dict(a=1.5, b=2.0, c=3.0, d=4.0, e=7.0, f=5.0, g=0.5, h=6.0)
    node = cpp_expr.parse(text, 0, len(text))
    plain = _evaluate(expression, cpp_expr.parse(expression, 0, len(expression)), values)
    assert _evaluate(text, node, dict(values, fused_amp_mutant=-1)) == plain
    for k, what in enumerate(mutants.list):
        assert _evaluate(text, node, dict(values, fused_amp_mutant=k)) != plain, what


def test_every_expression_of_the_op_headers_is_read_and_every_rounding_flip_found():
    """generate() asserts each rounding flip's text is in its file once; no expression of an op
    header is left unread (a new syntax there would otherwise get no mutant, silently)."""
    mutants = mutate_cpu_code.generate("AVX512")
    assert not mutants.unparsed, mutants.unparsed
    names = [m["name"] for m in mutants.list]
    for header in sorted(os.listdir(os.path.join(mutate_cpu_code.ROOT, "csrc", "ops"))):
        if header not in ("optimizer.h",):
            assert any(f"(ops/{header}:" in n for n in names), f"no mutant in ops/{header}"
    assert sum("one short" in n for n in names) >= 10
    flips = ("stochastic", "bf16", "the remainder", "24-bit", "signed", "unsigned", "fp8")
    assert sum(n.startswith(flips) for n in names) == len(mutate_cpu_code.ROUNDINGS)
