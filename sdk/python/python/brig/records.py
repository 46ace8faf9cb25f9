"""What brigd answers with, as typed records: attributes by field name, a readable `repr`, and
equality by value. The native module builds them (`_from_dict`); `to_dict()` gives the fields
back as plain data (nested records too)."""

from __future__ import annotations

from typing import Any, ClassVar


class Record:
    """A record from brigd. Read-only; two records are equal when their types and fields are."""

    __slots__ = ("_fields",)
    # Fields holding a record (or a list of records), converted from dicts.
    _nested: ClassVar[dict[str, type[Record]]] = {}

    def __init__(self, **fields: Any) -> None:
        object.__setattr__(self, "_fields", fields)

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Record:
        fields = dict(data)
        for name, kind in cls._nested.items():
            value = fields.get(name)
            if isinstance(value, dict):
                fields[name] = kind._from_dict(value)
            elif isinstance(value, list):
                fields[name] = [kind._from_dict(v) if isinstance(v, dict) else v for v in value]
        return cls(**fields)

    def __getattr__(self, name: str) -> Any:
        fields = object.__getattribute__(self, "_fields")
        try:
            return fields[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return bool(self._fields == other._fields)  # type: ignore[attr-defined]

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def _order(cls) -> list[str]:
        """The declared fields, in the order their class declares them."""
        names: list[str] = []
        for klass in reversed(cls.__mro__):
            for name in getattr(klass, "__annotations__", {}):
                if not name.startswith("_") and name not in names:
                    names.append(name)
        return names

    def __repr__(self) -> str:
        fields = self._fields
        order = [k for k in self._order() if k in fields] + sorted(set(fields) - set(self._order()))
        inner = ", ".join(f"{k}={fields[k]!r}" for k in order)
        return f"{type(self).__name__}({inner})"

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._fields))

    def to_dict(self) -> dict[str, Any]:
        def plain(v: Any) -> Any:
            if isinstance(v, Record):
                return v.to_dict()
            if isinstance(v, list):
                return [plain(x) for x in v]
            return v

        return {k: plain(v) for k, v in self._fields.items()}


class SandboxUsage(Record):
    cpu_ns: int
    memory_bytes: int


class VolumeMount(Record):
    volume: str
    path: str
    read_only: bool


class SandboxInfo(Record):
    """A sandbox: `status()`, `list()`, and what changes it answer with."""

    _nested = {"usage": SandboxUsage, "volumes": VolumeMount}
    id: str
    tier: str
    state: str
    labels: dict[str, str]
    created_unix_ms: int
    last_used_unix_ms: int
    idle_ttl_ms: int
    idle_action: str
    paused_ttl_ms: int | None
    max_lifetime_ms: int | None
    paused_unix_ms: int | None
    image: str | None
    usage: SandboxUsage | None
    egress: list[str] | None
    address: str | None
    qos: str
    placement: str | None
    volumes: list[VolumeMount]
    paused_files_only: bool


class FileEntry(Record):
    """A file of a sandbox: `list_dir()`, `stat()`."""

    path: str
    kind: str
    size: int
    mode: int
    modified_unix_ms: int
    uid: int
    gid: int
    metadata: dict[str, str]


class ExecInfo(Record):
    """A command of a sandbox, running or recently finished: `execs()`."""

    exec_id: int
    pid: int | None
    argv: list[str]
    result: dict[str, Any] | None
    buffered_bytes: int


class SessionOutput(Record):
    """What a shell session command printed: `Session.run()`, `Session.wait()`."""

    stdout: str
    stderr: str
    exit_code: int | None
    cwd: str | None


class AuditEvent(Record):
    seq: int
    unix_ms: int
    kind: Any


class ToolInfo(Record):
    name: str
    digest: str
    world: str
    description: str
    size_bytes: int


class LayerInfo(Record):
    name: str
    version: int
    digest: str
    data_bytes: int
    meta_bytes: int
    chunks: int
    files: int
    created_unix_ms: int
    source: str
    new_chunks: int


class LayerDetails(Record):
    _nested = {"layer": LayerInfo}
    layer: LayerInfo
    paths: list[str]


class GcSummary(Record):
    removed_layers: int
    removed_chunks: int
    freed_bytes: int


class PulledLayer(Record):
    layer: str
    diff_id: str
    reused: bool
    downloaded_bytes: int


class PulledImage(Record):
    _nested = {"layers": PulledLayer}
    name: str
    manifest_digest: str
    layers: list[PulledLayer]
    downloaded_bytes: int
    env: list[str]
    cmd: list[str]
    entrypoint: list[str]
    working_dir: str | None
    user: str | None


class PullLayerProgress(Record):
    digest: str
    size: int
    downloaded: int
    state: str


class PullProgress(Record):
    _nested = {"layers": PullLayerProgress}
    reference: str
    layers: list[PullLayerProgress]


class BuiltImage(Record):
    name: str
    layers: list[str]
    steps_run: int
    steps_cached: int
    env: list[Any]
    working_dir: str | None
    user: str | None
    entrypoint: list[str]
    cmd: list[str]


class VolumeInfo(Record):
    id: str
    name: str
    project: str | None
    quota_bytes: int
    used_bytes: int
    created_unix_ms: int
    mounted_by: list[str]


class VolumeEntry(Record):
    path: str
    kind: str
    size: int
    mode: int
    uid: int
    gid: int
    atime_unix_ms: int
    mtime_unix_ms: int
    ctime_unix_ms: int
    target: str | None


class NodeCapacity(Record):
    memory_total_bytes: int
    memory_available_bytes: int


class ImageStats(Record):
    backend: str
    fetched_bytes: int
    fetched_chunks: int
    cache_bytes: int
    corrupt_chunks: int


class SwapStatus(Record):
    device: str
    size_bytes: int
    stored_bytes: int
    ram_used_bytes: int


class NodeStatus(Record):
    """The node: `node_status()`."""

    _nested = {"capacity": NodeCapacity, "images": ImageStats, "swap": SwapStatus}
    node_id: int
    tiers: list[str]
    sandboxes: int
    images: ImageStats | None
    capacity: NodeCapacity
    daemon_rss_bytes: int
    swap: SwapStatus | None


class NodeSummary(Record):
    """A node of a cluster: `cluster_status()`."""

    node: int
    addr: str
    healthy: bool
    last_heartbeat_ms_ago: int
    tiers: list[str]
    sandboxes: int
    load_permille: int


class ProjectLimits(Record):
    max_live: int | None
    max_creates_per_sec: int | None


class ProjectInfo(Record):
    _nested = {"limits": ProjectLimits}
    name: str
    limits: ProjectLimits
    live: int


__all__ = [
    "AuditEvent",
    "BuiltImage",
    "ExecInfo",
    "FileEntry",
    "GcSummary",
    "ImageStats",
    "LayerDetails",
    "LayerInfo",
    "NodeCapacity",
    "NodeStatus",
    "NodeSummary",
    "ProjectInfo",
    "ProjectLimits",
    "PullLayerProgress",
    "PullProgress",
    "PulledImage",
    "PulledLayer",
    "Record",
    "SandboxInfo",
    "SandboxUsage",
    "SessionOutput",
    "SwapStatus",
    "ToolInfo",
    "VolumeEntry",
    "VolumeInfo",
    "VolumeMount",
]
