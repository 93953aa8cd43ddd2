"""A task: everything both servers, the clients and the analyst agree on, serialized as canonical
JSON and fingerprinted. The fingerprint is bound into every sealed share (HPKE info and associated
data), so a report made for one task cannot be counted in another."""
from __future__ import annotations

import hashlib
import json
import re
import secrets
import functools
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import numpy as np

from fss import DCF, layout

from ..errors import DpcdfError, ParameterError
from ..release.adaptive import MIN_ADAPTIVE_GRID, PLAN_VERSION, SHARE_RULE, AdaptiveMechanism
from ..release.policy import auto_mechanism, curve_budget
from ..release.calibration import group_scales
from ..release.factorization import sqrt_factorization
from ..release.grid import Grid
from ..release.payload import Payload
from ..release.mechanisms import ROOT_SHARE, Mechanism, PathMechanism, TreeMechanism, check_epsilon, check_relation
from ..release.zcdp import check_rho, gaussian_tree
from .files import TaskFileError, read_text
from .hpke import check_kem
from .verification.maths import Check

FORMAT = "dpcdf-task/v1"
OUT_BITS = 64
MAX_TREE_SIZE = 1 << 20
MAX_ZCDP_TREE_SIZE = 1 << 16
MAX_QUERY_POINTS = 1 << 16  # prefix indices per query (the analyst splits larger requests)
MAX_VERIFIED_GRID = 1 << 16  # grid points a task is verified at by default, and on a server without a Dask cluster
MAX_CLUSTER_VERIFIED_GRID = 1 << 20  # with verify=True, on servers with a cluster (`dpcdf serve --dask`)

KEY_FORMAT = 2  # a new verified task's F_p key format version (pinned: a newer fss format is a change of this line)
KEY_FORMATS = (1, 2)  # the versions a config may name (review of issue 43: not whatever fss reads next)
if not set(KEY_FORMATS) <= set(layout.KEY_FORMATS["p61"]):
    raise ImportError("fss no longer reads the F_p key formats the service's tasks are pinned to")


class SameServerError(ParameterError):
    """A task whose two servers are one: the same URL (after normalising scheme, host, port and
    trailing slashes) or the same HPKE key. A client would seal both shares of every value to one
    server, which could then read every value."""


def normal_url(url: str) -> str:
    """A server URL compared as a server: scheme and host in lower case, the scheme's default port
    made explicit, no trailing slashes (a string that is no http(s) URL: itself, stripped)."""
    try:
        parts = urlsplit(url.strip())
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), parts.port
    except ValueError:
        return url.strip()
    if scheme not in ("http", "https") or not host:
        return url.strip()
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port or (443 if scheme == 'https' else 80)}{parts.path.rstrip('/')}"


def check_distinct_servers(servers, hpke_keys=None) -> None:
    """SameServerError unless the two servers differ in URL and (if given) in HPKE key (see
    `SameServerError`)."""
    if normal_url(servers[0]) == normal_url(servers[1]):
        raise SameServerError(f"the task's two servers are one server ({servers[0]} and {servers[1]}): a client would "
                              "send both shares of every value to it; name two distinct servers")
    if hpke_keys is None:
        return
    a, b = (k.strip().lower() for k in hpke_keys)
    if a == b:
        raise SameServerError(f"the task's two servers have the same HPKE key ({a[:16]}...): whoever holds it opens both "
                              "shares of every value; each server needs its own key")


def _derived(method):
    """A TaskConfig's derived object (grid, DCF, check, fingerprint), built once per config: the
    config is frozen, so what it derives cannot change; before, each call rebuilt it (the grid and a
    Check on every `extras_bytes` access, the fingerprint's JSON for every report sealed)."""
    name = method.__name__

    @functools.wraps(method)
    def once(self):
        cache = self.__dict__.setdefault("_derived", {})  # outside the dataclass fields: not in JSON, eq or repr
        if name not in cache:
            cache[name] = method(self)
        return cache[name]
    return once


@dataclass(frozen=True)
class TaskConfig:
    """grid: {"kind": "uniform"|"log", "lo", "hi", "bits"} or {"kind": "thresholds", "values": [...]}.
    servers: both servers' base URLs; hpke_keys: their public keys for `kem` (hex, see `dpcdf.hpke`);
    two distinct servers: different URLs and different keys (else `SameServerError`);
    token_hash: SHA-256 of the analyst's bearer token (hex). payload "count": each report counts 1
    (an ECDF); "label": each report carries (label, 1 - label), two ECDFs in one key (a ROC curve:
    each curve epsilon/2 under add/remove, epsilon under substitution, as in `dpcdf.roc`);
    "calibration": each report carries (1, label, probability in units of 2^-16) for the
    Hosmer-Lemeshow statistic (split * epsilon for the ECDF of the probabilities, the rest for the
    group sums, as in `dpcdf.hosmer_lemeshow`). Under privacy "zcdp" the same split of rho (the policy
    table, `dpcdf/release/policy.py`): a label task's curves rho/2-zCDP each under add/remove, a
    calibration task's ECDF split * rho, its group sums the rest, all with the exact discrete Gaussian.

    verify: the servers check every report at the close and count only well-formed ones (keys over
    F_p plus the client's check randomness; `dpcdf.service.verification.maths`, docs/verification.md) and answer
    every query from a histogram share made once then. None (the default) means: verified when the
    payload can be and the grid has at most MAX_VERIFIED_GRID points; True allows grids of up to
    MAX_CLUSTER_VERIFIED_GRID, which servers without a Dask cluster refuse. A config without the field
    (written before verification existed) is unverified, and an unverified task's JSON leaves the
    field out, so its fingerprint is what it was.

    key_format: the F_p key format a verified task's keys are made and parsed with (`fss.DCF`'s
    `version`): 2, a rejection-sampled 61-bit word an element, for new tasks; 1, a whole AES block an
    element, for configs without the field (written before version 2), so that reports stored by an
    earlier release still parse and evaluate (on the portable backend). Pinned per task: a server
    parses only its task's format and refuses the other with a 400. An unverified task has ring keys:
    1, left out of the JSON."""

    grid: dict
    epsilon: float | None
    mechanism: str
    relation: str
    min_batch: int
    servers: tuple[str, str]
    hpke_keys: tuple[str, str]
    token_hash: str
    payload: Payload = Payload.COUNT  # a string in the JSON ("count", "label", "calibration"), parsed to a Payload
    split: float = 0.5
    kem: str = "x25519"
    verify: bool | None = None
    privacy: str = "pure"
    rho: float | None = None
    root_share: float = ROOT_SHARE
    fine_bins: bool = True
    adaptive_plan: int = PLAN_VERSION
    adaptive_shares: int = SHARE_RULE
    key_format: int = KEY_FORMAT
    task_id: str = field(default_factory=lambda: secrets.token_hex(16))
    format: str = FORMAT
    name: str | None = None  # a label for people (`dpcdf task --name`, `dpcdf admin tasks`): public, in the JSON

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", self.task_id):
            raise ParameterError(f"task_id must be 1 to 64 letters, digits, '-' or '_', got {self.task_id!r}")
        if not all(isinstance(v, str) for v in (*self.servers, *self.hpke_keys, self.token_hash, self.kem)):
            raise ParameterError("servers, hpke_keys, token_hash and kem are strings")
        if not isinstance(self.grid, dict):
            raise ParameterError(f"grid must be an object, got {self.grid!r:.80}")
        object.__setattr__(self, "payload", Payload.parse(self.payload))
        check_relation(self.relation)
        self._check_privacy()
        self._check_root_share()
        self._check_fine_bins()
        if isinstance(self.min_batch, bool) or not isinstance(self.min_batch, int) or self.min_batch < 0:
            raise ParameterError(f"min_batch must be an int >= 0, got {self.min_batch!r}")
        if self.payload.scored and (self.relation != "substitution" or not 0 < self.split < 1):
            raise ParameterError("a calibration task needs relation 'substitution' and a split in (0, 1)")
        if len(self.servers) != 2 or len(self.hpke_keys) != 2:
            raise ParameterError("a task has exactly two servers and two HPKE keys")
        check_distinct_servers(self.servers, self.hpke_keys)
        check_kem(self.kem)
        if self.format != FORMAT:
            raise ParameterError(f"unknown task format {self.format!r}")
        if self.name is not None and (not isinstance(self.name, str) or not re.fullmatch(r"[^\x00-\x1f\x7f]{1,80}", self.name)):
            raise ParameterError(f"a task's name is 1 to 80 printable characters, got {self.name!r:.100}")
        if self.relation == "add-remove" and self.min_batch != 0:
            raise ParameterError("under add/remove the number of reports is private, and a minimum-batch gate would "
                                 "reveal whether it reached the gate (even 1: no report against one): use min_batch=0")
        if self.mechanism == "adaptive" and (not self.payload.plain or not MIN_ADAPTIVE_GRID <= self.make_grid().size <= MAX_TREE_SIZE):
            raise ParameterError(f"an adaptive task releases one ECDF (payload 'count') on a grid of {MIN_ADAPTIVE_GRID} "
                                 f"to {MAX_TREE_SIZE} points")
        if self.mechanism == "tree" and self.make_grid().size > MAX_TREE_SIZE:
            raise ParameterError(f"the tree mechanism takes grids of up to {MAX_TREE_SIZE} points in a task "
                                 "(its planning would stall the server): use the path mechanism")
        if self.privacy == "zcdp" and self.make_grid().size > MAX_ZCDP_TREE_SIZE:
            raise ParameterError(f"a zCDP task takes grids of up to {MAX_ZCDP_TREE_SIZE} points (its discrete Gaussian "
                                 "sampler is pure Python)")
        self.make_mechanism()  # validates the grid, the noise scales and that the mechanism can be built
        size = self.make_grid().size
        if self.verify is None:
            object.__setattr__(self, "verify", size <= MAX_VERIFIED_GRID and self.payload.verifiable)
        if not isinstance(self.verify, bool):
            raise ParameterError(f"verify must be true or false, got {self.verify!r}")
        if self.verify:
            if size > MAX_CLUSTER_VERIFIED_GRID:
                raise ParameterError(f"a verified task evaluates every report at every grid point: at most "
                                     f"{MAX_CLUSTER_VERIFIED_GRID} points, on servers with a Dask cluster "
                                     f"(this grid has {size}); use verify=false")
            self.check()  # raises for a payload that cannot be verified
            if type(self.key_format) is not int or self.key_format not in KEY_FORMATS:
                raise ParameterError(f"key_format must be one of {', '.join(map(str, KEY_FORMATS))}, got {self.key_format!r:.40}")
        else:
            object.__setattr__(self, "key_format", 1)  # ring keys: one format
        if self.payload.scored:
            self.group_scales()  # the group sums' noise scales are in range

    def _check_root_share(self) -> None:
        """The add/remove tree's root share of epsilon (`mechanisms.ROOT_SHARE`), pinned in the config so a
        server derives the same noise scales forever: configs written before it (no field) keep the
        plan they were answered with (0: the root noised only in a full tree). It applies to pure
        add/remove tree count tasks; elsewhere it is 0 and left out of the JSON (label tasks keep the
        old plan, as the central `roc`)."""
        applies = self.privacy == "pure" and self.mechanism == "tree" and self.relation == "add-remove" and self.payload.plain
        if not applies:
            object.__setattr__(self, "root_share", 0.0)
        share = self.root_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
            raise ParameterError(f"root_share must be a number in [0, 1), got {share!r:.40}")

    def _check_fine_bins(self) -> None:
        """Whether an adaptive task's round one also counts fine bins (`AdaptiveMechanism.fine`), pinned
        in the config like the root share: configs written before them (no field) keep the 32 bins they
        were answered with. It applies to adaptive tasks; elsewhere it is False and left out of the JSON.
        So is the plan's version (`AdaptiveMechanism.plan_version`): a server fixes round two's design
        the first time it is asked, so an analyst must plan it from round one with the rules the task
        was made with (configs without the field: version 1; left out of the JSON when it is 1). And so is
        the rule of round one's shares of epsilon (`AdaptiveMechanism.share_rule`, `adaptive_shares`: 2,
        under add/remove, shrinks them above eps 0.5, gives a round-two histogram a count of n and
        cuts light spikes into 8-point bins; a
        config without the field keeps rule 1, the fixed 15% and 5%, its noise scales and fingerprint; a
        round one without fine bins has rule 1's shares whatever the field says)."""
        if self.mechanism != "adaptive":
            object.__setattr__(self, "fine_bins", False)
            object.__setattr__(self, "adaptive_shares", 1)
        if not isinstance(self.fine_bins, bool):
            raise ParameterError(f"fine_bins must be true or false, got {self.fine_bins!r:.40}")
        if not self.fine_bins:  # the plan's versions and the shares' rules differ only where round one has fine bins
            object.__setattr__(self, "adaptive_plan", 1)
            object.__setattr__(self, "adaptive_shares", 1)

    def _check_privacy(self) -> None:
        """pure: epsilon-DP with discrete Laplace noise, mechanism 'path', 'tree' or 'adaptive' (two
        rounds, `dpcdf.release.adaptive`: the servers answer round one's bins, then one round-two
        design, fixed by the analyst's first round-two query). zcdp: rho-zCDP with
        the exact discrete Gaussian, mechanism 'factorization' (the square-root factorization, grids of
        up to 2^13 points, payload 'count': it releases one ECDF) or 'tree' (any payload: a label task's
        two curves and a calibration task's ECDF and group sums, as the policy table splits rho), no
        epsilon."""
        if self.privacy == "pure":
            check_epsilon(self.epsilon)
            if self.rho is not None:
                raise ParameterError("rho is for privacy 'zcdp'")
            if self.mechanism not in ("path", "tree", "adaptive"):
                raise ParameterError(f"a task's mechanism is 'path', 'tree' or 'adaptive', got {self.mechanism!r}")
        elif self.privacy == "zcdp":
            if self.epsilon is not None:
                raise ParameterError("a zCDP task takes rho, not epsilon")
            check_rho(self.rho)
            if self.mechanism not in ("factorization", "tree"):
                raise ParameterError(f"a zCDP task's mechanism is 'factorization' or 'tree', got {self.mechanism!r}")
            if not self.payload.plain and self.mechanism != "tree":
                raise ParameterError(f"a zCDP {self.payload.value!r} task uses the Gaussian tree (mechanism 'tree'): the "
                                     "factorization releases one ECDF (payload 'count')")
        else:
            raise ParameterError(f"privacy must be 'pure' or 'zcdp', got {self.privacy!r}")

    # --- derived ------------------------------------------------------------------------------
    @_derived
    def make_grid(self) -> Grid:
        grid = grid_from_spec(self.grid)
        grid.thresholds.flags.writeable = False  # shared by every user of this config
        return grid

    @staticmethod
    def default_mechanism(grid: dict, relation: str, privacy: str = "pure", epsilon: float | None = None,
                          payload: str = "count") -> str:
        """What `dpcdf task` picks without --mechanism: `dpcdf.release_ecdf`'s "auto" (the policy table
        in `dpcdf/release/policy.py`; the tree for label and calibration payloads), with the tree past
        MAX_TREE_SIZE, where a task takes none."""
        size = grid_from_spec(grid).size
        choice = auto_mechanism(size, relation, privacy, epsilon, payload)
        return "tree" if choice == "adaptive" and size > MAX_TREE_SIZE else choice

    @property
    def n_public(self) -> bool:
        """Whether the number of reports may be revealed: under substitution it is public; under
        add/remove it is not (and there is no minimum batch: min_batch is 0)."""
        return self.relation == "substitution"

    @property
    def width(self) -> int:
        return self.payload.width

    def make_mechanism(self) -> Mechanism:
        """The mechanism of each released ECDF (for a label payload: of each of the two curves)."""
        size = self.make_grid().size
        if self.privacy == "zcdp":  # rho of each curve: the policy table's (all of it for a count task)
            assert self.rho is not None  # (checked: a zCDP task has rho)
            rho, relation = curve_budget(self.payload, self.rho, self.relation, self.split)
            if self.mechanism == "factorization":
                return sqrt_factorization(size, rho, relation)
            return gaussian_tree(size, rho, relation)
        assert self.epsilon is not None  # (checked: a pure task has epsilon)
        if self.mechanism == "adaptive":  # its round-two tree's plan is ROOT_SHARE's: a new plan needs a new name
            return AdaptiveMechanism(size, self.epsilon, self.relation, fine=self.fine_bins, plan_version=self.adaptive_plan,
                                     share_rule=self.adaptive_shares)
        if self.mechanism == "tree" and self.payload.plain:
            return TreeMechanism(size, self.epsilon, self.relation, root_share=self.root_share)
        eps, relation = curve_budget(self.payload, self.epsilon, self.relation, self.split)
        if self.mechanism == "path":
            return PathMechanism(size, eps, relation)
        return TreeMechanism(size, eps, relation, root_share=0)  # label and calibration tasks keep their plan

    @property
    def budget(self) -> float:
        """The task's whole budget: epsilon, or rho under privacy "zcdp"."""
        budget = self.rho if self.privacy == "zcdp" else self.epsilon
        assert budget is not None  # (checked: rho under "zcdp", else epsilon)
        return budget

    def group_scales(self) -> list:
        """The noise of a calibration task's group sums (n, O, E): discrete Laplace scales, or under zCDP
        discrete Gaussian variances (`calibration.group_scales`)."""
        return group_scales(self.budget, self.split, self.privacy)

    @_derived
    def dcf(self) -> DCF:
        """The comparison every report shares: f_a(t) = beta if t >= a, so sum_a f_a(i) counts values
        <= t_i (beta = 1, or (label, 1 - label)). The shape of what the servers release (a verified
        task's keys carry more: `key_dcf`)."""
        if self.verify:
            return DCF(self.make_grid().bits, width=self.width, cmp="ge", group="p61", version=self.key_format)
        return DCF(self.make_grid().bits, OUT_BITS, self.width, cmp="ge")

    @_derived
    def key_dcf(self) -> DCF:
        """The DCF the clients' keys are made with: `dcf`, except that a verified task's keys also carry
        kappa * beta, the report check's MAC (`verification.maths.Check.key_width`)."""
        if self.verify:
            return DCF(self.make_grid().bits, width=self.check().key_width, cmp="ge", group="p61", version=self.key_format)
        return self.dcf()

    @_derived
    def check(self) -> "Check":
        """The report check of a verified task, with its MAC against a deviating server
        (ParameterError for a payload that has none)."""
        return Check(self.payload, self.make_grid().size, mac=True)

    @property
    def extras_bytes(self) -> int:
        """Bytes after the key in each server's share: the client's check randomness (0 if unverified)."""
        return 8 * self.check().extras if self.verify else 0

    def to_json(self) -> str:
        d = asdict(self)
        d["servers"], d["hpke_keys"] = list(self.servers), list(self.hpke_keys)
        if not self.verify:
            del d["verify"]  # configs from before verification: the same JSON, the same fingerprint
        if self.privacy == "pure":
            del d["privacy"], d["rho"]  # and from before zCDP tasks
        if self.root_share == 0:
            del d["root_share"]  # and from before the add/remove root share
        if not self.fine_bins:
            del d["fine_bins"]  # and from before round one's fine bins
        if self.adaptive_plan == 1:
            del d["adaptive_plan"]  # and from before the plan's version 2
        if self.adaptive_shares == 1:
            del d["adaptive_shares"]  # and from before the shares' rule 2
        if self.key_format == 1:
            del d["key_format"]  # and from before F_p key format 2 (and every unverified task)
        if self.name is None:
            del d["name"]  # and from before task names
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_file(cls, path: str) -> "TaskConfig":
        """The config in the task file at `path` (what `dpcdf task --out` wrote); `TaskFileError` naming it."""
        text = read_text(path, "task file")
        try:
            return cls.from_json(text)
        except DpcdfError as exc:
            raise TaskFileError(f"task file {path} is not a task config: {exc}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise TaskFileError(f"task file {path} is not a task config ({exc.__class__.__name__}: {exc})") from None

    @classmethod
    def from_json(cls, text: str | bytes) -> "TaskConfig":
        try:
            d = json.loads(text)
            d["servers"], d["hpke_keys"] = tuple(d["servers"]), tuple(d["hpke_keys"])
            d.setdefault("verify", False)
            d.setdefault("root_share", 0.0)  # a config from before the root share: the plan it was answered with
            d.setdefault("fine_bins", False)  # and from before round one's fine bins: its 32 bins
            d.setdefault("adaptive_plan", 1)  # and from before the plan's version 2
            d.setdefault("adaptive_shares", 1)  # and from before the shares' rule 2
            d.setdefault("key_format", 1)  # and from before F_p key format 2
            return cls(**d)
        except ParameterError:
            raise
        except (ValueError, TypeError, KeyError, RecursionError, ArithmeticError) as exc:
            raise ParameterError(f"not a task configuration: {exc!r:.200}") from None

    @property
    @_derived
    def fingerprint(self) -> bytes:
        return hashlib.sha256(self.to_json().encode()).digest()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def grid_from_spec(g: dict) -> Grid:
    """A task's grid from its JSON spec (`TaskConfig.grid`); ParameterError if it is not one."""
    kind = g.get("kind") if isinstance(g, dict) else None
    try:
        if kind == "uniform":
            return Grid.uniform(float(g["lo"]), float(g["hi"]), int(g["bits"]))
        if kind == "log":
            return Grid.log(float(g["lo"]), float(g["hi"]), int(g["bits"]))
        if kind == "thresholds":
            return Grid.from_thresholds(np.asarray(g["values"], dtype=np.float64))
    except ParameterError:
        raise
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise ParameterError(f"not a {kind} grid: {exc!r:.120}") from None
    raise ParameterError(f"unknown grid kind {kind!r}")
