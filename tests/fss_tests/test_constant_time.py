"""The portable backend's gen kernels (`fss._kernels.gen_level`, `gen_leaf`: every F_p key and every
payload width above the fused kernels' is generated there) take no branch and compute no address from
secret data: alpha's bits, the control bits, the PRG output, the seeds and the payload state.

Two checks, each run on the kernel and on its previous, branching version (which each must flag):
- the Python source (ast): no `if`, conditional expression, `while`, short-circuit `and`/`or`, loop
  bound or subscript index depends on a name derived from the contents of a secret argument;
- the LLVM IR numba compiles for the kernel's signature: no conditional branch (`br i1`) or `switch`
  on a value loaded from a secret array (followed through arithmetic, casts, selects and phis), and no
  `getelementptr` index derived from one (a secret-indexed load or store); `select` is data flow.
Not checked: the machine code LLVM emits (its x86 backend may turn a select into a branch), values
round-tripped through memory other than the secret arrays, the AES calls between levels (pycryptodome's
ECB), the numpy code around the kernels (the F_p payload step is elementwise masks there, see
`fss.portable._gen_payload_prime`), the fused kernels, and timing itself."""
import ast
import inspect
import re
import textwrap

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
_DEF = re.compile(rf"^\s*({_VALUE}) = (.*)$")


def ir_violations(ir: str, secrets: tuple) -> list[str]:
    """Branches, switches and addresses in the kernel's own function that depend on a value loaded
    from a secret argument's data (numba passes an array's data pointer as %arg.<name>.4)."""
    body = []
    for line in ir.splitlines():  # the first function defined: the kernel (the others are wrappers)
        if line.startswith("define"):
            if body:
                break
            body.append(line)
        elif body:
            if line.startswith("}"):
                break
            body.append(line)
    assert body, "no function in the IR"
    pointers = {f"%arg.{name}.4" for name in secrets}  # addresses inside a secret array
    values: set[str] = set()  # values derived from a secret array's contents
    changed = True
    while changed:
        before = (len(pointers), len(values))
        for line in body[1:]:
            m = _DEF.match(line)
            if not m:
                continue
            result, rhs = m.groups()
            ops = re.findall(_VALUE, rhs)
            op = rhs.split()[0]
            if op == "load":
                if ops and ops[-1] in pointers:
                    values.add(result)
            elif any(o in values for o in ops):
                values.add(result)
            if op != "load" and any(o in pointers for o in ops):
                pointers.add(result)
        changed = (len(pointers), len(values)) != before
    found = []
    for line in body[1:]:
        s = line.strip()
        ops = re.findall(_VALUE, s)
        if s.startswith("br i1 ") and ops and ops[0] in values:
            found.append(f"branch on a secret: {s[:120]}")
        elif s.startswith("switch ") and ops and ops[0] in values:
            found.append(f"switch on a secret: {s[:120]}")
        elif "getelementptr" in s and any(o in values for o in ops):
            found.append(f"address from a secret: {s[:120]}")
    return found


def compiled_ir(py_func, sig) -> str:
    """The optimized LLVM IR of `py_func` for `sig`, compiled here (fss's kernels load from the on-disk
    cache, where numba cannot show their IR)."""
    dispatcher = numba.njit(nogil=True)(py_func)
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
    ir = compiled_ir(spec["kernel"].py_func, spec["sig"])
    assert "%arg.t" in ir or "%arg.t1" in ir  # the argument naming the check relies on
    assert ir_violations(ir, spec["secrets"]) == []


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
