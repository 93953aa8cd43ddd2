"""The JSON the server takes and gives, as Pydantic models (they are also its OpenAPI schema).
Checks that need the task (grid size, mechanism) are the server's (`answers.check`); these check shape
and type. A query model converts to and from its plain type (`dpcdf.release.queries`, `to_query`,
`from_query`), which is what the server answers and the analyst asks."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictInt, Tag

from ...release import queries as plain
from ..task import MAX_QUERY_POINTS
from .answers import KINDS  # noqa: F401 (the Discriminator's message; also this module's name for it)


class Error(BaseModel):
    """Every refusal: a 4xx status and this body."""
    error: str


class Health(BaseModel):
    """What anyone may know: the server is up, and whether its kernels are compiled."""
    party: int
    status: Literal["ok"] = "ok"
    warm: bool = Field(description="whether the kernels are compiled (answers before are slower)")


class OperatorHealth(Health):
    """For the operator only: how long its work runs can tell the number of reports, which is private
    under add/remove."""
    checking: bool = Field(description="whether round one of verified tasks' reports has work queued or running "
                                       "(a close now waits for it)")


class Hpke(BaseModel):
    kdf: str = "HKDF-SHA256"
    aead: str = "AES-128-GCM"
    keys: dict[str, str] = Field(description="this server's public key per KEM, hex")


class TaskSpec(BaseModel):
    """A task configuration (`dpcdf.service.task.TaskConfig`), documentation only: the server reads
    the body with TaskConfig.from_json, whose canonical form the fingerprint is taken of."""
    model_config = ConfigDict(extra="allow")
    grid: dict
    epsilon: float | None = Field(description="pure epsilon-DP tasks; null for zCDP")
    mechanism: Literal["path", "tree", "adaptive", "factorization"]
    relation: Literal["substitution", "add-remove"]
    min_batch: int
    servers: list[str] = Field(min_length=2, max_length=2)
    hpke_keys: list[str] = Field(min_length=2, max_length=2)
    token_hash: str
    payload: Literal["count", "label", "calibration"] = "count"
    split: float = 0.5
    kem: Literal["x25519", "mlkem768-x25519"] = "x25519"
    privacy: Literal["pure", "zcdp"] = "pure"
    rho: float | None = Field(None, description="zCDP tasks: rho (discrete Gaussian noise)")
    root_share: float = Field(0.0, description="pure add/remove tree count tasks: the root's share of epsilon "
                              "(0.2 for new tasks; absent: 0, the plan before it)")
    task_id: str | None = Field(None, description="1 to 64 of A-Z, a-z, 0-9, '-', '_'; random if left out")
    format: str = "dpcdf-task/v1"


class TaskRegistered(BaseModel):
    task_id: str
    fingerprint: str = Field(description="SHA-256 of the canonical config, hex")


class TaskStatus(BaseModel):
    task_id: str
    reports: int | None = Field(description="stored (or, once closed, fixed) reports; None under add/remove")
    closed: bool
    min_batch: int
    checked: float | None = Field(None, description="a verified task before its check is over, where n is public: "
                                  "the share of its reports this server has evaluated for the check (round one), 0 to 1")
    restored: Literal["finished", "unfinished"] | None = Field(
        None, description="on a server restored from a backup: whether the task was finished in it; an unfinished "
        "one takes no report, close or step again (409): run it again as a new task")


class Accepted(BaseModel):
    accepted: Literal[1] = 1


class Rejected(BaseModel):
    index: int
    error: str


class BatchAccepted(BaseModel):
    accepted: int
    duplicates: int = Field(description="reports stored before with these very bytes: acknowledged, counted once")
    rejected: list[Rejected] = Field(description="reports not stored, by index: refused, or their id taken (`conflicts`)")
    conflicts: int = Field(0, description="reports whose id this server holds with another share: not stored, not "
                           "acknowledged (each is in `rejected` too, error 'report id taken by other content')")


class CloseResponse(BaseModel):
    party: int
    closed: Literal[True] = True
    reconciled: bool
    n: int | None = Field(description="reports after reconciliation, once reconciled and if public")
    reports_hash: str | None = Field(description="keyed hash of the report set, once reconciled")
    rejected: dict[str, int] | None = Field(None, description="verified tasks: reports the check excluded, per "
                                            "reason class (weight, shape, range), once done")


# --- the operator's admin API (`routers.admin`, issue 24) ---------------------------------------------
class AdminTask(BaseModel):
    task_id: str
    name: str | None = None  # the task's label (`TaskConfig.name`), if it has one
    state: str  # collecting, closed, reconciled, verified, answered, released, expired or deleted
    verified_task: bool
    created: float
    closed_at: float | None
    reconciled_at: float | None
    verified_at: float | None
    answered_at: float | None
    purged_at: float | None
    purge_reason: str | None
    stored: int  # report rows on this server (0 once its key shares are deleted)
    counted: int | None  # the closed report set's size
    excluded: int
    segment_files: int
    histogram: bool
    queries: int
    restored: str | None = None  # from a backup: 'finished', or 'unfinished' (refused: run it again)


class AdminTasks(BaseModel):
    party: int
    tasks: list[AdminTask]


class PurgeResult(BaseModel):
    task_id: str
    reason: str
    reports: int  # report rows deleted now
    files: int  # segment files removed now


class SweepResult(BaseModel):
    purged: list[PurgeResult]


def _indices(v: list[int]) -> list[int]:
    if not v:
        raise ValueError("indices must be a non-empty list of grid indices")
    if len(v) > MAX_QUERY_POINTS:
        raise ValueError(f"at most {MAX_QUERY_POINTS} indices per query")
    return v


def _edges(v: list[int]) -> list[int]:
    if any(b < a for a, b in zip(v, v[1:])):
        raise ValueError("edges must be non-decreasing grid indices")
    return v


class QueryModel(BaseModel):
    """A query's JSON: the same field names as its plain type (`dpcdf.release.queries`); any other field
    is refused (400), not ignored: `{"kind": "nodes", "level": 0, "groups": [...]}` is not a bins query."""
    model_config = ConfigDict(extra="forbid")

    def to_query(self) -> plain.Query:
        """The plain query this JSON names."""
        return plain.from_dict(self.model_dump(exclude_none=True))

    @classmethod
    def from_query(cls, q: plain.Query) -> "QueryModel":
        """The JSON of a plain query (validated as a request is)."""
        return cls.model_validate(plain.to_dict(q))


class PrefixQuery(QueryModel):
    """Shares of the noisy counts of reports with index <= i, for each i."""
    kind: Literal["prefix"]
    indices: Annotated[list[StrictInt], AfterValidator(_indices)]


class NodesQuery(QueryModel):
    """Shares of the noisy counts of every data-holding node of one released tree level (`whole`: of an
    adaptive task's whole tree, plan version 6, not its round-two tree; fixes the task's route)."""
    kind: Literal["nodes"]
    level: StrictInt
    whole: StrictBool | None = None


class GroupsQuery(QueryModel):
    """Calibration tasks: shares of the noisy group sums between these grid indices (once per task)."""
    kind: Literal["groups"]
    edges: Annotated[list[StrictInt], AfterValidator(_edges)]


class CoordinatesQuery(QueryModel):
    """Factorization tasks (zCDP): shares of R x + noise at every coordinate, then (substitution) of n."""
    kind: Literal["coordinates"]


class BinsQuery(QueryModel):
    """Adaptive tasks: shares of noisy bin counts. Round 0 (plan versions 6 to 8; no ends): the counts
    that choose the route: n itself under substitution (from version 8 round one's fine bins' counts,
    noisy); under add/remove the whole grid's count, from version 7 the fine bins' counts, noisy. Round 1: the task's fixed equal-width bins (no
    ends; plan version 9: the nodes of one level of the tree, with that level's node noise). Round 2: the bins ending at `ends` (strictly increasing grid indices, the last one the grid's
    last), fixed by the task's first round-two query: a task answers one round-two design only (these
    bins, or its tree's nodes), as another would spend the budget again."""
    kind: Literal["bins"]
    round: Annotated[StrictInt, Field(ge=0, le=2)]
    ends: Annotated[list[StrictInt], Field(max_length=MAX_QUERY_POINTS)] | None = None
    groups: Annotated[list[StrictInt], Field(max_length=MAX_QUERY_POINTS)] | None = None


def _kind(v: object) -> object:
    return v.get("kind") if isinstance(v, dict) else getattr(v, "kind", None)


Query = Annotated[
    Union[Annotated[PrefixQuery, Tag("prefix")], Annotated[NodesQuery, Tag("nodes")], Annotated[GroupsQuery, Tag("groups")],
          Annotated[CoordinatesQuery, Tag("coordinates")], Annotated[BinsQuery, Tag("bins")]],
    Discriminator(_kind, custom_error_type="kind", custom_error_message=KINDS),
]


MODELS: dict[type, type[QueryModel]] = {plain.PrefixQuery: PrefixQuery, plain.NodesQuery: NodesQuery,
                                        plain.GroupsQuery: GroupsQuery, plain.CoordinatesQuery: CoordinatesQuery,
                                        plain.BinsQuery: BinsQuery}
"""Each plain query type's model (`Query` is their union, tagged by kind)."""


class QueryResponse(BaseModel):
    party: int
    n: int | None = Field(description="reports after reconciliation, if public")
    reports_hash: str
    width: int = Field(description="values per point: shares holds points * width of them, row-major")
    shares: list[str] = Field(description="this server's shares, unsigned 64-bit integers in decimal")
    modulus: str = Field(str(1 << 64), description="the shares add up modulo this (decimal): 2^64, or "
                         "p = 2^61 - 1 for a verified task")


Responses = dict[Union[int, str], dict[str, Any]]  # a route's `responses` (FastAPI's type)


def errors(*codes: int) -> Responses:
    """The `responses` entry documenting these refusals."""
    return {code: {"model": Error, "description": _WHY[code]} for code in codes}


_WHY = {400: "malformed request", 401: "no or wrong bearer token", 403: "refused: not the operator, too few reports, or budget spent",
        404: "unknown task", 408: "the body stopped coming or took too long (the connection is closed)",
        409: "conflicts with the task's state", 411: "a body over 64 KiB without a Content-Length",
        413: "body over the size limit", 429: "too many requests from this client: send again after Retry-After seconds",
        502: "the other server did not answer", 503: "not ready yet: send again after Retry-After seconds"}
