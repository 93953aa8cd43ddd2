"""The portable backend's gen kernels (`fss._kernels.gen_level`, `gen_leaf`: every F_p key and every
payload width above the fused kernels' is generated there) take no branch and compute no address from
secret data: alpha's bits, the control bits, the PRG output, the seeds and the payload state. The fused
tiers' gen and eval kernels: `test_constant_time_fused.py`, with the IR check defined here.

Two checks, each run on the kernel and on its previous, branching version (which each must flag):
- the Python source (ast): no `if`, conditional expression, `while`, short-circuit `and`/`or`, loop
  bound or subscript index depends on a name derived from the contents of a secret argument;
- the optimized LLVM IR numba compiles for the kernel's signature (`ir_taint`), in every function of
  the module the kernel calls: no conditional branch, `switch`, address (`getelementptr`, the pointer
  of a load, store, masked or memory intrinsic, prefetch), indirect call or division that depends on a
  value loaded from a secret array, followed through arithmetic, casts, phis, selects, vector and
  aggregate operations, intrinsics, calls (arguments to parameters, returns back) and memory (a secret
  stored anywhere makes what is loaded from there secret); `select` is data flow. An access through a
  pointer the model cannot place in an object is a violation too.
Not checked: the machine code LLVM emits (its x86 backend may turn a select into a branch), numba's
reference counting (NRT_*), the AES calls between levels (pycryptodome's ECB), the numpy code around the
kernels (the F_p payload step is elementwise masks there, see `fss.portable._gen_payload_prime`), and
timing itself. The portable eval kernels: `test_constant_time_portable_eval.py`."""
import ast
import inspect
import re
import textwrap
from collections import Counter

import numba
import numpy as np
import pytest
from numba import types as T

import fss._kernels as K
from fss import DCF, DPF, backend

A = lambda dtype, ndim: T.Array(dtype, ndim, "C")  # noqa: E731
GEN_LEVEL = dict(kernel=K.gen_level, secrets=("out", "s", "t", "v_alpha", "a_bits", "below"),
                 sig=(A(T.uint64, 4), A(T.uint64, 3), A(T.uint8, 2), A(T.uint64, 2), A(T.uint8, 1), A(T.uint64, 2),
                      A(T.uint64, 2), A(T.uint8, 1), A(T.uint64, 2), T.boolean))
GEN_LEAF = dict(kernel=K.gen_leaf, secrets=("conv0", "conv1", "t1", "v_alpha", "equal"),
                sig=(A(T.uint64, 2), A(T.uint64, 2), A(T.uint8, 1), A(T.uint64, 2), A(T.uint64, 2), A(T.uint64, 2)))

# The kernels before they were made branch-free (fss/_kernels.py at 8c0de4b): the checks must flag them.
OLD = '''
def gen_level(out, s, t, v_alpha, a_bits, below, cw_seed, cw_t, cw_v, has_v):
    w, n = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        keep = np.int64(a_bits[k])
        lose = 1 - keep
        s_lo = (out[0, k, lose, 0] ^ out[1, k, lose, 0]) & _NOT1
        s_hi = out[0, k, lose, 1] ^ out[1, k, lose, 1]
        t_l = np.uint8((out[0, k, 0, 0] ^ out[1, k, 0, 0]) & _U1) ^ np.uint8(keep) ^ np.uint8(1)
        t_r = np.uint8((out[0, k, 1, 0] ^ out[1, k, 1, 0]) & _U1) ^ np.uint8(keep)
        cw_seed[0, k] = s_lo
        cw_seed[1, k] = s_hi
        cw_t[k] = t_l | (t_r << np.uint8(1))
        t_keep = t_r if keep else t_l
        t1 = t[1, k]
        if has_v:
            for e in range(w):
                wl, wk = lose * w + e, keep * w + e
                vcw = out[1, k, 2 + (wl >> 1), wl & 1] - out[0, k, 2 + (wl >> 1), wl & 1] - v_alpha[e, k]
                if lose == 0:
                    vcw += below[e, k]
                if t1:
                    vcw = _U0 - vcw
                cw_v[e, k] = vcw
                signed_cw = _U0 - vcw if t1 else vcw
                v_alpha[e, k] += out[0, k, 2 + (wk >> 1), wk & 1] - out[1, k, 2 + (wk >> 1), wk & 1] + signed_cw
        for b in range(2):
            lo = out[b, k, keep, 0]
            tm = _U0 - np.uint64(t[b, k])
            s[b, 0, k] = (lo & _NOT1) ^ (s_lo & tm)
            s[b, 1, k] = out[b, k, keep, 1] ^ (s_hi & tm)
            t[b, k] = np.uint8(lo & _U1) ^ (t_keep & t[b, k])


def gen_leaf(conv0, conv1, t1, v_alpha, equal, cw_last):
    w, n = v_alpha.shape[0], v_alpha.shape[1]
    for k in range(n):
        for e in range(w):
            c = conv1[e, k] - conv0[e, k] - v_alpha[e, k] + equal[e, k]
            cw_last[e, k] = _U0 - c if t1[k] else c
'''


# --- the source check -------------------------------------------------------------------------------
def source_violations(source: str, name: str, secrets: tuple) -> list[str]:
    """Conditions, loop bounds and indices of function `name` in `source` that depend on a secret."""
    fn = next(n for n in ast.walk(ast.parse(textwrap.dedent(source))) if isinstance(n, ast.FunctionDef) and n.name == name)
    tainted: set[str] = set()

    def secret(node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in tainted  # an array argument itself is not secret: its contents are
        if isinstance(node, ast.Attribute) and node.attr == "shape":
            return False  # shapes are public
        if isinstance(node, ast.Subscript):
            if isinstance(node.value, ast.Name) and node.value.id in secrets:
                return True
            if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
                return False
        return any(secret(child) for child in ast.iter_child_nodes(node))

    def names(target) -> list[str]:
        return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]

    changed = True
    while changed:  # to a fixpoint: names derived from secrets, through any assignment
        before = len(tainted)
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                        pairs = zip(target.elts, node.value.elts)
                    else:
                        pairs = [(target, node.value)]
                    for t, v in pairs:
                        if secret(v) and not isinstance(t, ast.Subscript):
                            tainted.update(names(t))
            elif isinstance(node, ast.AugAssign) and secret(node.value) and isinstance(node.target, ast.Name):
                tainted.add(node.target.id)
        changed = len(tainted) != before
    found = []
    for node in ast.walk(fn):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)) and secret(node.test):
            found.append(f"line {node.lineno}: condition {ast.unparse(node.test)}")
        elif isinstance(node, ast.BoolOp) and any(secret(v) for v in node.values):
            found.append(f"line {node.lineno}: short-circuit {ast.unparse(node)}")
        elif isinstance(node, ast.For) and secret(node.iter):
            found.append(f"line {node.lineno}: loop over {ast.unparse(node.iter)}")
        elif isinstance(node, ast.Subscript) and secret(node.slice):
            found.append(f"line {node.lineno}: index {ast.unparse(node)}")
    return found


# --- the LLVM IR check ------------------------------------------------------------------------------
_VALUE = r'%(?:"[^"]*"|[-\w.$]+)'
_NAMES = re.compile(rf'{_VALUE}|@(?:"[^"]*"|[-\w.$]+)')
_STRING = re.compile(r'(?<![%@\w])c?"[^"]*"')  # string constants (inline assembly, its constraints): no operands
_DEF = re.compile(rf"^({_VALUE}) = (.*)$")
_CALLEE = re.compile(rf'(@(?:"[^"]*"|[-\w.$]+)|{_VALUE})\(')
_SIZES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "ptr": 8, "float": 4, "double": 8}
# calls that read or write memory, and the positions of their address (and length) arguments
_MEMORY = {"llvm.masked.load": (0,), "llvm.masked.gather": (0,), "llvm.masked.store": (1,), "llvm.masked.scatter": (1,),
           "llvm.memcpy": (0, 1, 2), "llvm.memmove": (0, 1, 2), "llvm.memset": (0, 2), "llvm.prefetch": (0,)}
_RUNTIME = "NRT_"  # numba's runtime: allocation and reference counts, on the meminfo's header only (not followed)


def _split(text: str) -> list[str]:
    """`text` split at its top-level commas (not those inside (), [], {} or <>)."""
    parts, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += (ch in "([{<") - (ch in ")]}>")
        if ch == "," and depth == 0:
            parts.append(text[start:k])
            start = k + 1
    return parts + [text[start:]]


def _parens(text: str, start: int) -> str:
    """The text inside the parentheses that open at text[start]."""
    depth = 0
    for k in range(start, len(text)):
        depth += (text[k] == "(") - (text[k] == ")")
        if depth == 0:
            return text[start + 1 : k]
    raise ValueError(text[start:])


def _decode(no: int, result, rhs: str) -> tuple:
    """(IR line, result, opcode, operands) of one instruction; the operands' shape depends on the opcode."""
    op = next(w for w in rhs.split() if w not in ("tail", "musttail", "notail"))
    rest = rhs.split(None, 1)[1] if " " in rhs else ""
    names = _NAMES.findall
    if op == "load":  # (address, whether it loads a pointer)
        return no, result, op, (names(rhs), "ptr" in _split(re.sub(r"^(atomic |volatile )*", "", rest))[0])
    if op == "store":  # (value, address)
        value, address = _split(rest)[:2]
        return no, result, op, (names(value), names(address))
    if op == "getelementptr":  # (base, indices, constant byte offset or None)
        parts = _split(rest)
        ty, idx = re.sub(r"^((inbounds|nuw|nusw|inrange\([^)]*\))\s+)*", "", parts[0].strip()), [p.split() for p in parts[2:]]
        m = re.fullmatch(r"(?:[<\[](\d+) x )?(\w+)[>\]]?", ty)  # i64, <8 x i64>, [2 x i64]: a size; a struct: none
        size = int(m.group(1) or 1) * _SIZES[m.group(2)] if m and m.group(2) in _SIZES else None
        delta = size * int(idx[0][-1]) if size and len(idx) == 1 and re.fullmatch(r"-?\d+", idx[0][-1]) else None
        return no, result, "gep", (names(parts[1]), names(",".join(parts[2:])), delta)
    if op in ("call", "invoke"):  # (callee, arguments, return type): inline assembly has no callee
        if " asm " in f" {rhs} ":
            return no, result, "call", (None, [names(rhs)], rhs.split(" asm ")[0])
        m = _CALLEE.search(rhs)
        return no, result, "call", (m.group(1).lstrip("@").strip('"'), [names(a) for a in _split(_parens(rhs, m.end() - 1))],
                                    rhs[: m.start()])
    if op in ("br", "switch", "indirectbr", "ret"):  # (condition or returned value,)
        return no, result, op, (names(_split(rest)[0]) if op != "br" or rest.startswith("i1 ") else [],)
    return no, result, op, (names(rhs), rhs)


def parse_module(ir: str) -> dict:
    """name -> ([(parameter, is a pointer)], [decoded instructions]) of every function `ir` defines."""
    funcs: dict = {}
    body = None
    for no, line in enumerate(ir.splitlines(), 1):
        if line.startswith("define"):
            m = _CALLEE.search(line)
            params = [((_NAMES.findall(p) or [None])[-1], "ptr" in p) for p in _split(_parens(line, m.end() - 1))]
            body = funcs.setdefault(m.group(1).lstrip("@").strip('"'), (params, []))[1]
        elif body is not None and line.startswith("}"):
            body = None
        elif body is not None:
            s = _STRING.sub("", line).split(";", 1)[0].strip()
            if s and not s.endswith(":") and not re.match(r"(i\d+ |\])", s):  # not a label nor a switch's case
                m = _DEF.match(s)
                body.append(_decode(no, *((m.group(1), m.group(2)) if m else (None, s))))
    return funcs


def short_name(symbol: str) -> str:
    """A numba symbol's Python name: _ZN3fss4fast...6kernelB2v1... -> fss.fast._batch_kernel.<locals>.kernel."""
    rest, parts = symbol[3:] if symbol.startswith("_ZN") else "", []
    while d := re.match(r"\d+", rest):
        parts.append(rest[d.end() : d.end() + int(d.group())])
        rest = rest[d.end() + int(d.group()) :]
    return ".".join(parts).replace("_3clocals_3e", "<locals>").replace("_3cdynamic_3e", "<dynamic>") or symbol


def ir_taint(ir: str, secrets: tuple, declassify: tuple = ()) -> dict:
    """Follows the contents of the kernel's secret arrays (numba passes an array's data pointer as
    %arg.<name>.4) through the kernel and every function of the module it calls, to a fixpoint (see the
    module docstring). Calls are context-insensitive (a parameter takes every call's argument). Memory:
    objects (an argument's data, an alloca, an allocation, or X*, what pointers loaded from object X
    point to); pointers carry (object, byte offset or None) pairs, and pointers stored in memory are kept
    per (object, offset), so that an array's struct in a stack slot keeps its data pointer apart from its
    meminfo. A call outside the module may read through its pointers and store there the secrets it is
    given. `declassify`: regexes of instructions whose result is public whatever their operands."""
    funcs = parse_module(ir)
    entries = [f for f, (params, _) in funcs.items() if all((f"%arg.{s}.4", True) in params for s in secrets)]
    mem = {f"{f}|%arg.{s}.4" for f in entries for s in secrets}  # objects holding a secret
    pointee: dict = {}  # (object, offset or None) -> the pointers stored there
    taint: dict = {f: set() for f in funcs}
    ptrs = {f: {p: {(f"{f}|{p}", 0)} for p, is_ptr in params if is_ptr} for f, (params, _) in funcs.items()}
    returns: dict = {f: [False, set()] for f in funcs}
    plan, todo = {}, list(entries)  # the kernel and every function it calls, transitively (not numba's wrappers)
    while todo:
        f = todo.pop()
        if f not in plan and not f.startswith(_RUNTIME):
            plan[f] = funcs[f][1]
            todo += [ops[0] for _, _, op, ops in plan[f] if op == "call" and ops[0] in funcs]
    changed = True

    def pts(f, names) -> set:
        return set().union(*({(n, 0)} if n.startswith("@") else ptrs[f].get(n, set()) for n in names))

    def bases(pairs) -> set:
        return {b for b, _ in pairs}

    def star(b: str) -> str:
        return b if b.endswith("*") else b + "*"

    def secret(f, names) -> bool:
        return any(n in taint[f] for n in names)

    def grow(target: set, items: set) -> None:
        """target |= items; pointers at more than 4 offsets of one object (a pointer stepping through it) at any."""
        nonlocal changed
        if items <= target:
            return
        new = target | items
        if target is not mem:
            count = Counter(b for b, _ in new)
            wide = {b for b, off in new if off is None or count[b] > 4}
            new = {(b, off) for b, off in new if b not in wide} | {(b, None) for b in wide}
        if new != target:
            target.clear()
            target.update(new)
            changed = True

    def define(f, result, is_secret: bool, pairs: set) -> None:
        nonlocal changed
        if is_secret and result not in taint[f]:
            taint[f].add(result)
            changed = True
        if pairs:
            grow(ptrs[f].setdefault(result, set()), pairs)

    def load(f, result, address, pointer=False) -> None:
        where, got = pts(f, address), set()
        if pointer:  # the pointers stored where it reads, and X* for each object X
            got = {(star(b), None) for b in bases(where)}
            for b, off in where:
                got |= set().union(*(v for (b2, o2), v in pointee.items() if b2 == b and (off is None or o2 in (off, None))))
        define(f, result, bool(bases(where) & mem) or secret(f, address), got)

    def store(f, value, address) -> None:
        where = pts(f, address)
        if secret(f, value):
            grow(mem, bases(where))
        for pair in where if pts(f, value) else ():
            grow(pointee.setdefault(pair, set()), pts(f, value))

    while changed:
        changed = False
        for f, instrs in plan.items():
            for no, result, op, ops in instrs:
                callee = (ops[0] or "") if op == "call" else ""
                kind = next((k for k in _MEMORY if callee == k or callee.startswith(k + ".")), None)
                if op == "load":
                    load(f, result, *ops)
                elif op == "store":
                    store(f, *ops)
                elif op == "gep":
                    moved = {(b, off + ops[2] if off is not None and ops[2] is not None else None) for b, off in pts(f, ops[0])}
                    define(f, result, secret(f, ops[0] + ops[1]), moved)
                elif op == "alloca":
                    define(f, result, False, {(f"{f}|{result}", 0)})
                elif op == "ret":
                    if secret(f, ops[0]) and not returns[f][0]:
                        returns[f][0] = changed = True
                    grow(returns[f][1], pts(f, ops[0]))
                elif callee in plan:  # the arguments to the parameters, the returns back
                    for (p, _), a in zip(funcs[callee][0], ops[1]):
                        if p:
                            define(callee, p, secret(f, a), pts(f, a))
                    if result:
                        define(f, result, returns[callee][0], returns[callee][1])
                elif callee.startswith(_RUNTIME):
                    if result and "ptr" in ops[2]:  # an allocation: a new object
                        define(f, result, False, {(f"{f}|{result}", 0)})
                elif kind in ("llvm.masked.load", "llvm.masked.gather"):
                    load(f, result, ops[1][0])
                elif kind in ("llvm.masked.store", "llvm.masked.scatter"):
                    store(f, ops[1][0], ops[1][1])
                elif kind in ("llvm.memcpy", "llvm.memmove"):
                    src, dst = pts(f, ops[1][1]), bases(pts(f, ops[1][0]))
                    if bases(src) & mem or secret(f, ops[1][1]):
                        grow(mem, dst)
                    for b in dst:  # the pointers it copies: what the source's objects point to
                        grow(pointee.setdefault((b, None), set()), {(star(s), None) for s in bases(src)})
                elif kind == "llvm.memset":
                    store(f, ops[1][1], ops[1][0])
                elif op == "call" and kind is None:  # an intrinsic, inline assembly, an external function
                    flat = [n for a in ops[1] for n in a]
                    if secret(f, flat):
                        grow(mem, bases(pts(f, flat)))
                    if result:
                        new = {(f"{f}|{result}", 0)} if "ptr" in ops[2] else set()
                        define(f, result, secret(f, flat) or bool(bases(pts(f, flat)) & mem),
                               new | {(star(b), None) for b in bases(pts(f, flat))})
                elif result and op != "call":
                    keep = op in ("phi", "select", "bitcast", "addrspacecast", "freeze")  # pointers keep their offsets
                    define(f, result, secret(f, ops[0]) and not any(re.search(d, ops[1]) for d in declassify),
                           {(b, off if keep else None) for b, off in pts(f, ops[0])})
    lines, found = ir.splitlines(), []
    for f, instrs in plan.items():
        for no, result, op, ops in instrs:
            callee = (ops[0] or "") if op == "call" else ""
            kind = next((k for k in _MEMORY if callee == k or callee.startswith(k + ".")), None)
            if op in ("br", "indirectbr") and secret(f, ops[0]):
                what = "branch on a secret"
            elif op == "switch" and secret(f, ops[0]):
                what = "switch on a secret"
            elif (op == "gep" and secret(f, ops[0] + ops[1])) or (op == "load" and secret(f, ops[0])) or \
                    (op == "store" and secret(f, ops[1])) or (kind and secret(f, [n for q in _MEMORY[kind] for n in ops[1][q]])):
                what = "address from a secret"
            elif callee.startswith("%") and secret(f, [callee]):
                what = "call through a secret"
            elif op in ("udiv", "sdiv", "urem", "srem") and secret(f, ops[0]):
                what = "division of a secret (variable time)"
            elif (op == "load" and not pts(f, ops[0])) or (op == "store" and not pts(f, ops[1])) or \
                    (kind and kind != "llvm.prefetch" and not pts(f, ops[1][_MEMORY[kind][0]])):
                what = "memory access through an untracked pointer"  # the model would not see what it reads or writes
            else:
                continue
            found.append(f"{what} in {short_name(f)} (IR line {no}): {lines[no - 1].strip()[:150]}")
    loads = sum(1 for f, instrs in plan.items() for _, r, op, _ in instrs if op == "load" and r in taint[f])
    return {"violations": found, "entries": [short_name(f) for f in entries], "functions": sorted(map(short_name, plan)),
            "secret_loads": loads}


def ir_violations(ir: str, secrets: tuple, declassify: tuple = ()) -> list[str]:
    """`ir_taint`'s violations: conditional branches, switches, addresses (getelementptr, the address of
    a load, store, masked or memory intrinsic, prefetch), indirect calls and divisions that depend on a
    secret, in any function the kernel reaches. Asserts that the kernel was found and reads a secret."""
    found = ir_taint(ir, secrets, declassify)
    assert len(found["entries"]) == 1 and found["secret_loads"], f"no kernel reading {secrets} in the IR: {found}"
    return found["violations"]


def compiled_ir(py_func, sig) -> str:
    """The optimized LLVM IR of `py_func` for `sig`, compiled here (fss's kernels load from the on-disk
    cache, where numba cannot show their IR), without numba's Python and C wrappers (not the kernel's code)."""
    dispatcher = numba.njit(nogil=True, no_cpython_wrapper=True, no_cfunc_wrapper=True)(py_func)
    dispatcher.compile(sig)
    return dispatcher.inspect_llvm(dispatcher.signatures[0])


def _old(name):
    scope = {"np": np, "_U0": np.uint64(0), "_U1": np.uint64(1), "_NOT1": ~np.uint64(1)}
    exec(compile(OLD, "<old fss._kernels>", "exec"), scope)  # noqa: S102 - the test's own constant source
    return scope[name]


@pytest.mark.parametrize("spec", [GEN_LEVEL, GEN_LEAF], ids=["gen_level", "gen_leaf"])
def test_source_has_no_secret_dependent_condition_or_index(spec):
    py = spec["kernel"].py_func
    assert source_violations(inspect.getsource(py), py.__name__, spec["secrets"]) == []
    assert source_violations(inspect.getsource(K._pick.py_func), "_pick", ("one", "zero", "mask")) == []


@pytest.mark.parametrize("spec", [GEN_LEVEL, GEN_LEAF], ids=["gen_level", "gen_leaf"])
def test_the_source_check_flags_the_branching_version(spec):
    name = spec["kernel"].py_func.__name__
    found = source_violations(OLD, name, spec["secrets"])
    assert found and all("line" in f for f in found)
    if name == "gen_level":
        assert any("condition lose == 0" in f for f in found) and any("keep, 0]" in f for f in found)


@pytest.mark.parametrize("spec", [GEN_LEVEL, GEN_LEAF], ids=["gen_level", "gen_leaf"])
def test_compiled_ir_has_no_secret_dependent_branch_or_address(spec):
    assert ir_violations(compiled_ir(spec["kernel"].py_func, spec["sig"]), spec["secrets"]) == []


def test_the_ir_check_flags_the_branching_version():
    """The old gen_level's secret-indexed loads (out[b, k, keep, 0]) survive into the IR. (The old
    gen_leaf's one branch, `-c if t1[k] else c`, LLVM already made a select: only the ast check flags it.)"""
    found = ir_violations(compiled_ir(_old("gen_level"), GEN_LEVEL["sig"]), GEN_LEVEL["secrets"])
    assert any(f.startswith("address from a secret") for f in found), found


@pytest.mark.parametrize("fn", [DCF(10, 64, 9, cmp="le"), DPF(9, 32, 6), DCF(11, group="p61", width=3),
                                DPF(8, group="p61", width=2), DCF(7, 16, 2, signed=True, cmp="gt")], ids=repr)
def test_the_branch_free_kernels_give_the_fused_kernels_bits(fn):
    """Same keys from the portable backend as from the fastest tier (or, for widths and groups it does
    not take, as from fss.reference: tests/fss_tests/test_vectors.py pins the vectors themselves)."""
    from fss import reference as R
    from fss.testing import expand_seed, gen_batch

    lo, hi = fn.params.domain_range()
    alphas = [lo, lo + 1, hi, hi - 37, lo + 100 % (hi - lo)]
    with backend.using("portable"):
        k0, k1 = gen_batch(fn, alphas, 5, seed=7)
    with backend.using(backend.available()[-1]):
        f0, f1 = gen_batch(fn, alphas, 5, seed=7)
    assert k0.to_bytes() == f0.to_bytes() and k1.to_bytes() == f1.to_bytes()
    rnd = expand_seed(7, 32 * len(alphas))
    for i, a in enumerate(alphas):
        r0, r1 = R.gen(fn.params, a, [5] * fn.width, int.from_bytes(rnd[32 * i:32 * i + 16], "little"),
                       int.from_bytes(rnd[32 * i + 16:32 * i + 32], "little"))
        assert R.encode(fn.params, r0) == k0[i].to_bytes() and R.encode(fn.params, r1) == k1[i].to_bytes()
