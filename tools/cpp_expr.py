"""A small parser of the C++ expressions in csrc/ops/*.h, for tools/mutate_cpu_code.py: it finds
each binary operator's operands, so that a mutant can swap the operator alone.

Covers what the op headers write: literals, names (with ::, template arguments after the names
in TEMPLATES), calls, member access, subscripts, unary and binary operators, ?:, assignments and
braced lists. Anything else raises ParseError: the caller lists what it could not read.
"""
import re

TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*|/\*.*?\*/|\#[^\n]*)
  | (?P<number>(?:0[xX](?:[0-9a-fA-F]*\.?[0-9a-fA-F]*[pP][+-]?\d+|[0-9a-fA-F]+)
                 |(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)[uUlLfF]*)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op><<=|>>=|::|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|[-+*/%<>=!~&|^?:.,;()\[\]{}])
""", re.X | re.S)

# binary operators by precedence, loosest first (assignment and ?: are handled apart)
BINARY = [["||"], ["&&"], ["|"], ["^"], ["&"], ["==", "!="], ["<", ">", "<=", ">="], ["<<", ">>"],
          ["+", "-"], ["*", "/", "%"]]
PRECEDENCE = {op: level for level, ops in enumerate(BINARY) for op in ops}
ASSIGN = {"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="}
UNARY = {"-", "+", "!", "~", "++", "--", "&", "*"}
# names followed by template arguments, not by a less-than
TEMPLATES = {"static_cast", "reinterpret_cast", "const_cast", "bit_cast", "numeric_limits", "is_same_v",
             "conditional_t", "decay_t"}


class ParseError(ValueError):
    pass


class Node:
    """A parsed expression: its kind, its span [start, end) in the text, its children in order,
    and for a binary or assignment node its operator and the operator's offset."""

    def __init__(self, kind, start, end, children=(), op=None, op_at=None):
        self.kind, self.start, self.end, self.children = kind, start, end, list(children)
        self.op, self.op_at = op, op_at

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def tokenize(text, start=0, end=None):
    """(kind, text, offset) of each token of text[start:end], spaces and comments left out."""
    end = len(text) if end is None else end
    tokens, pos = [], start
    while pos < end:
        m = TOKEN.match(text, pos, end)
        if not m:
            raise ParseError(f"no token at {text[pos:pos + 20]!r}")
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group(), m.start()))
        pos = m.end()
    return tokens


class Parser:
    def __init__(self, tokens, text_end):
        self.tokens, self.i, self.text_end = tokens, 0, text_end

    def peek(self, k=0):
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else ("end", "", self.text_end)

    def take(self, want=None):
        tok = self.peek()
        if tok[0] == "end" or (want is not None and tok[1] != want):
            raise ParseError(f"expected {want or 'a token'} at {tok[1]!r}")
        self.i += 1
        return tok

    def end_of_last(self):
        kind, text, at = self.tokens[self.i - 1]
        return at + len(text)

    def expression(self):  # a comma inside an expression is not written in the op headers
        return self.assignment()

    def assignment(self):
        left = self.conditional()
        kind, op, at = self.peek()
        if op in ASSIGN:
            self.take()
            right = self.assignment()
            return Node("assign", left.start, right.end, [left, right], op, at)
        return left

    def conditional(self):
        cond = self.binary(0)
        if self.peek()[1] != "?":
            return cond
        self.take("?")
        a = self.assignment()
        self.take(":")
        b = self.assignment()
        return Node("?:", cond.start, b.end, [cond, a, b])

    def binary(self, level):
        if level == len(BINARY):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek()[1] in BINARY[level]:
            _, op, at = self.take()
            right = self.binary(level + 1)
            left = Node("binary", left.start, right.end, [left, right], op, at)
        return left

    def unary(self):
        kind, op, at = self.peek()
        if kind == "op" and op in UNARY:
            self.take()
            operand = self.unary()
            return Node("unary", at, operand.end, [operand], op, at)
        return self.postfix()

    def postfix(self):
        node = self.primary()
        while True:
            kind, op, at = self.peek()
            if op == "(":
                args = self.list_of("(", ")")
                node = Node("call", node.start, self.end_of_last(), [node] + args)
            elif op == "[":
                self.take("[")
                index = self.expression()
                self.take("]")
                node = Node("index", node.start, self.end_of_last(), [node, index])
            elif op in (".", "->"):
                self.take()
                self.take()
                node = Node("member", node.start, self.end_of_last(), [node])
            elif op in ("++", "--"):
                self.take()
                node = Node("unary", node.start, self.end_of_last(), [node], op, at)
            else:
                return node

    def list_of(self, open_, close):
        self.take(open_)
        items = []
        while self.peek()[1] != close:
            items.append(self.expression())
            if self.peek()[1] == ",":
                self.take(",")
        self.take(close)
        return items

    def template_arguments(self):
        depth = 0
        while True:
            _, op, _ = self.take()
            depth += {"<": 1, ">": -1, ">>": -2}.get(op, 0)
            if depth <= 0:
                return

    def primary(self):
        kind, text, at = self.peek()
        if kind == "number":
            self.take()
            return Node("literal", at, self.end_of_last())
        if text == "(":
            self.take("(")
            inner = self.expression()
            self.take(")")
            return Node("paren", at, self.end_of_last(), [inner])
        if text == "{":
            items = self.list_of("{", "}")
            return Node("braces", at, self.end_of_last(), items)
        if kind == "name" or text == "::":
            while True:
                kind, text, _ = self.peek()
                if text == "::":
                    self.take()
                    continue
                if kind != "name":
                    raise ParseError(f"expected a name at {text!r}")
                self.take()
                if text in TEMPLATES and self.peek()[1] == "<":
                    self.template_arguments()
                if self.peek()[1] != "::":
                    break
            if self.peek()[1] == "{":  # T{} and the like
                self.list_of("{", "}")
            return Node("name", at, self.end_of_last())
        raise ParseError(f"unexpected {text!r}")


def parse(text, start, end):
    """The expression text[start:end] as a Node; ParseError when it is not one whole expression."""
    parser = Parser(tokenize(text, start, end), end)
    node = parser.expression()
    if parser.peek()[0] != "end":
        raise ParseError(f"text after the expression: {parser.peek()[1]!r}")
    return node
