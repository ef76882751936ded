from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_TYPE_UNSPECIFIED: _ClassVar[FileType]
    REGULAR: _ClassVar[FileType]
    DIRECTORY: _ClassVar[FileType]
    SYMLINK: _ClassVar[FileType]
    FIFO: _ClassVar[FileType]
    CHAR_DEVICE: _ClassVar[FileType]
    BLOCK_DEVICE: _ClassVar[FileType]
    SOCKET: _ClassVar[FileType]

class PersistState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERSIST_NONE: _ClassVar[PersistState]
    PERSIST_PENDING: _ClassVar[PersistState]
    PERSIST_DONE: _ClassVar[PersistState]
    PERSIST_FAILED: _ClassVar[PersistState]

class DataOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DATA_OP_UNSPECIFIED: _ClassVar[DataOp]
    WRITE_BLOCK: _ClassVar[DataOp]
    READ_BLOCK: _ClassVar[DataOp]
    DELETE_BLOCK: _ClassVar[DataOp]
    PING: _ClassVar[DataOp]
    SC_READ_OPEN: _ClassVar[DataOp]
    SC_WRITE_OPEN: _ClassVar[DataOp]
    SC_WRITE_COMMIT: _ClassVar[DataOp]
    RESPONSE: _ClassVar[DataOp]
    READ_RAW: _ClassVar[DataOp]
    FETCH_BLOCKS: _ClassVar[DataOp]
FILE_TYPE_UNSPECIFIED: FileType
REGULAR: FileType
DIRECTORY: FileType
SYMLINK: FileType
FIFO: FileType
CHAR_DEVICE: FileType
BLOCK_DEVICE: FileType
SOCKET: FileType
PERSIST_NONE: PersistState
PERSIST_PENDING: PersistState
PERSIST_DONE: PersistState
PERSIST_FAILED: PersistState
DATA_OP_UNSPECIFIED: DataOp
WRITE_BLOCK: DataOp
READ_BLOCK: DataOp
DELETE_BLOCK: DataOp
PING: DataOp
SC_READ_OPEN: DataOp
SC_WRITE_OPEN: DataOp
SC_WRITE_COMMIT: DataOp
RESPONSE: DataOp
READ_RAW: DataOp
FETCH_BLOCKS: DataOp

class RequestHeader(_message.Message):
    __slots__ = ("epoch", "client_id", "request_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    client_id: str
    request_id: str
    def __init__(self, epoch: _Optional[int] = ..., client_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class WorkerAddr(_message.Message):
    __slots__ = ("worker_id", "host", "port", "uds_path", "node_id")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    UDS_PATH_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    host: str
    port: int
    uds_path: str
    node_id: str
    def __init__(self, worker_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., uds_path: _Optional[str] = ..., node_id: _Optional[str] = ...) -> None: ...

class Inode(_message.Message):
    __slots__ = ("id", "type", "mode", "size", "mtime", "ctime", "atime", "block_size", "replication", "blocks", "symlink_target", "version", "xattrs", "parent", "name", "uid", "gid", "rdev", "created", "tenant", "bind", "ufs_key", "etag", "seen", "listed", "persist", "persist_error", "nlink", "subdirs", "persisted_etag")
    class XattrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    CTIME_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    XATTRS_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    UFS_KEY_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    SEEN_FIELD_NUMBER: _ClassVar[int]
    LISTED_FIELD_NUMBER: _ClassVar[int]
    PERSIST_FIELD_NUMBER: _ClassVar[int]
    PERSIST_ERROR_FIELD_NUMBER: _ClassVar[int]
    NLINK_FIELD_NUMBER: _ClassVar[int]
    SUBDIRS_FIELD_NUMBER: _ClassVar[int]
    PERSISTED_ETAG_FIELD_NUMBER: _ClassVar[int]
    id: int
    type: FileType
    mode: int
    size: int
    mtime: float
    ctime: float
    atime: float
    block_size: int
    replication: int
    blocks: _containers.RepeatedScalarFieldContainer[int]
    symlink_target: str
    version: int
    xattrs: _containers.ScalarMap[str, bytes]
    parent: int
    name: str
    uid: int
    gid: int
    rdev: int
    created: bool
    tenant: str
    bind: int
    ufs_key: str
    etag: str
    seen: float
    listed: float
    persist: PersistState
    persist_error: str
    nlink: int
    subdirs: int
    persisted_etag: str
    def __init__(self, id: _Optional[int] = ..., type: _Optional[_Union[FileType, str]] = ..., mode: _Optional[int] = ..., size: _Optional[int] = ..., mtime: _Optional[float] = ..., ctime: _Optional[float] = ..., atime: _Optional[float] = ..., block_size: _Optional[int] = ..., replication: _Optional[int] = ..., blocks: _Optional[_Iterable[int]] = ..., symlink_target: _Optional[str] = ..., version: _Optional[int] = ..., xattrs: _Optional[_Mapping[str, bytes]] = ..., parent: _Optional[int] = ..., name: _Optional[str] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ..., rdev: _Optional[int] = ..., created: _Optional[bool] = ..., tenant: _Optional[str] = ..., bind: _Optional[int] = ..., ufs_key: _Optional[str] = ..., etag: _Optional[str] = ..., seen: _Optional[float] = ..., listed: _Optional[float] = ..., persist: _Optional[_Union[PersistState, str]] = ..., persist_error: _Optional[str] = ..., nlink: _Optional[int] = ..., subdirs: _Optional[int] = ..., persisted_etag: _Optional[str] = ...) -> None: ...

class PersistTask(_message.Message):
    __slots__ = ("seq", "kind", "inode", "version", "bind", "key", "upload_id", "parts", "staged", "size", "crc32c", "attempts", "error", "canceled", "uri", "if_match")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UPLOAD: _ClassVar[PersistTask.Kind]
        DELETE: _ClassVar[PersistTask.Kind]
    UPLOAD: PersistTask.Kind
    DELETE: PersistTask.Kind
    SEQ_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    STAGED_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CANCELED_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    IF_MATCH_FIELD_NUMBER: _ClassVar[int]
    seq: int
    kind: PersistTask.Kind
    inode: int
    version: int
    bind: int
    key: str
    upload_id: str
    parts: _containers.RepeatedCompositeFieldContainer[PartDone]
    staged: bool
    size: int
    crc32c: int
    attempts: int
    error: str
    canceled: bool
    uri: str
    if_match: str
    def __init__(self, seq: _Optional[int] = ..., kind: _Optional[_Union[PersistTask.Kind, str]] = ..., inode: _Optional[int] = ..., version: _Optional[int] = ..., bind: _Optional[int] = ..., key: _Optional[str] = ..., upload_id: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[PartDone, _Mapping]]] = ..., staged: _Optional[bool] = ..., size: _Optional[int] = ..., crc32c: _Optional[int] = ..., attempts: _Optional[int] = ..., error: _Optional[str] = ..., canceled: _Optional[bool] = ..., uri: _Optional[str] = ..., if_match: _Optional[str] = ...) -> None: ...

class PartDone(_message.Message):
    __slots__ = ("number", "etag", "size")
    NUMBER_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    number: int
    etag: str
    size: int
    def __init__(self, number: _Optional[int] = ..., etag: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class PersistReport(_message.Message):
    __slots__ = ("header", "worker_id", "task", "upload_id", "parts", "size", "crc32c", "error", "uri", "key")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    worker_id: str
    task: int
    upload_id: str
    parts: _containers.RepeatedCompositeFieldContainer[PartDone]
    size: int
    crc32c: int
    error: str
    uri: str
    key: str
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., worker_id: _Optional[str] = ..., task: _Optional[int] = ..., upload_id: _Optional[str] = ..., parts: _Optional[_Iterable[_Union[PartDone, _Mapping]]] = ..., size: _Optional[int] = ..., crc32c: _Optional[int] = ..., error: _Optional[str] = ..., uri: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class BlockMeta(_message.Message):
    __slots__ = ("block_id", "inode", "length", "crc32c", "replicas", "replication", "quarantined", "ufs")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    UFS_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    inode: int
    length: int
    crc32c: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    replication: int
    quarantined: _containers.RepeatedScalarFieldContainer[str]
    ufs: bool
    def __init__(self, block_id: _Optional[int] = ..., inode: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ..., replication: _Optional[int] = ..., quarantined: _Optional[_Iterable[str]] = ..., ufs: _Optional[bool] = ...) -> None: ...

class BlockLocation(_message.Message):
    __slots__ = ("block_id", "offset", "length", "crc32c", "replicas", "token", "uncached")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    UNCACHED_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    offset: int
    length: int
    crc32c: int
    replicas: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    token: str
    uncached: bool
    def __init__(self, block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ..., token: _Optional[str] = ..., uncached: _Optional[bool] = ...) -> None: ...

class PathRequest(_message.Message):
    __slots__ = ("header", "path")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class Owner(_message.Message):
    __slots__ = ("uid", "gid")
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    uid: int
    gid: int
    def __init__(self, uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class MkdirRequest(_message.Message):
    __slots__ = ("header", "path", "mode", "parents", "owner")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    mode: int
    parents: bool
    owner: Owner
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., parents: _Optional[bool] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("header", "path", "mode", "exclusive", "block_size", "replication", "truncate", "owner", "type", "rdev")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXCLUSIVE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    RDEV_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    mode: int
    exclusive: bool
    block_size: int
    replication: int
    truncate: bool
    owner: Owner
    type: FileType
    rdev: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., exclusive: _Optional[bool] = ..., block_size: _Optional[int] = ..., replication: _Optional[int] = ..., truncate: _Optional[bool] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ..., type: _Optional[_Union[FileType, str]] = ..., rdev: _Optional[int] = ...) -> None: ...

class SymlinkRequest(_message.Message):
    __slots__ = ("header", "path", "target", "owner")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    target: str
    owner: Owner
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., target: _Optional[str] = ..., owner: _Optional[_Union[Owner, _Mapping]] = ...) -> None: ...

class LinkRequest(_message.Message):
    __slots__ = ("header", "src", "dst")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    src: str
    dst: str
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ...) -> None: ...

class ListDirRequest(_message.Message):
    __slots__ = ("header", "path", "start_after", "limit")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    START_AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    start_after: str
    limit: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., start_after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListDirResponse(_message.Message):
    __slots__ = ("entries", "truncated")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[Inode]
    truncated: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[Inode, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class RenameRequest(_message.Message):
    __slots__ = ("header", "src", "dst", "no_replace")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    NO_REPLACE_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    src: str
    dst: str
    no_replace: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., src: _Optional[str] = ..., dst: _Optional[str] = ..., no_replace: _Optional[bool] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("header", "path", "recursive", "directory", "file")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    RECURSIVE_FIELD_NUMBER: _ClassVar[int]
    DIRECTORY_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    recursive: bool
    directory: bool
    file: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., recursive: _Optional[bool] = ..., directory: _Optional[bool] = ..., file: _Optional[bool] = ...) -> None: ...

class SetAttrRequest(_message.Message):
    __slots__ = ("header", "path", "mode", "mtime", "atime", "set_xattrs", "remove_xattrs", "uid", "gid")
    class SetXattrsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    ATIME_FIELD_NUMBER: _ClassVar[int]
    SET_XATTRS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_XATTRS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    GID_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    mode: int
    mtime: float
    atime: float
    set_xattrs: _containers.ScalarMap[str, bytes]
    remove_xattrs: _containers.RepeatedScalarFieldContainer[str]
    uid: int
    gid: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., mode: _Optional[int] = ..., mtime: _Optional[float] = ..., atime: _Optional[float] = ..., set_xattrs: _Optional[_Mapping[str, bytes]] = ..., remove_xattrs: _Optional[_Iterable[str]] = ..., uid: _Optional[int] = ..., gid: _Optional[int] = ...) -> None: ...

class LayoutRequest(_message.Message):
    __slots__ = ("header", "path", "inode", "exclude_fetchers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FETCHERS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    inode: int
    exclude_fetchers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ..., inode: _Optional[int] = ..., exclude_fetchers: _Optional[_Iterable[str]] = ...) -> None: ...

class FileLayout(_message.Message):
    __slots__ = ("inode", "blocks")
    INODE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    blocks: _containers.RepeatedCompositeFieldContainer[BlockLocation]
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[BlockLocation, _Mapping]]] = ...) -> None: ...

class AllocateBlockRequest(_message.Message):
    __slots__ = ("header", "inode", "client_node", "exclude_workers", "size_hint")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_NODE_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SIZE_HINT_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    inode: int
    client_node: str
    exclude_workers: _containers.RepeatedScalarFieldContainer[str]
    size_hint: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., inode: _Optional[int] = ..., client_node: _Optional[str] = ..., exclude_workers: _Optional[_Iterable[str]] = ..., size_hint: _Optional[int] = ...) -> None: ...

class AbandonBlocksRequest(_message.Message):
    __slots__ = ("header", "inode", "block_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    inode: int
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., inode: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CommittedBlock(_message.Message):
    __slots__ = ("block_id", "length", "crc32c", "replicas")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    length: int
    crc32c: int
    replicas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, block_id: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., replicas: _Optional[_Iterable[str]] = ...) -> None: ...

class CommitFileRequest(_message.Message):
    __slots__ = ("header", "inode", "size", "blocks", "mtime", "base_version", "base_blocks", "replace", "path", "closing")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MTIME_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    BASE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CLOSING_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    inode: int
    size: int
    blocks: _containers.RepeatedCompositeFieldContainer[CommittedBlock]
    mtime: float
    base_version: int
    base_blocks: _containers.RepeatedScalarFieldContainer[int]
    replace: bool
    path: str
    closing: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., inode: _Optional[int] = ..., size: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[CommittedBlock, _Mapping]]] = ..., mtime: _Optional[float] = ..., base_version: _Optional[int] = ..., base_blocks: _Optional[_Iterable[int]] = ..., replace: _Optional[bool] = ..., path: _Optional[str] = ..., closing: _Optional[bool] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("addr", "capacity_bytes", "used_bytes", "free_bytes", "inflight", "block_count", "mem_tier_bytes", "mem_tier_hit_ratio", "draining", "metrics_addr", "started")
    ADDR_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    INFLIGHT_FIELD_NUMBER: _ClassVar[int]
    BLOCK_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEM_TIER_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEM_TIER_HIT_RATIO_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDR_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    addr: WorkerAddr
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    inflight: int
    block_count: int
    mem_tier_bytes: int
    mem_tier_hit_ratio: float
    draining: bool
    metrics_addr: str
    started: float
    def __init__(self, addr: _Optional[_Union[WorkerAddr, _Mapping]] = ..., capacity_bytes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., inflight: _Optional[int] = ..., block_count: _Optional[int] = ..., mem_tier_bytes: _Optional[int] = ..., mem_tier_hit_ratio: _Optional[float] = ..., draining: _Optional[bool] = ..., metrics_addr: _Optional[str] = ..., started: _Optional[float] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ("header", "info", "blocks")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    info: WorkerInfo
    blocks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., info: _Optional[_Union[WorkerInfo, _Mapping]] = ..., blocks: _Optional[_Iterable[int]] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ("epoch", "heartbeat_interval_ms", "leader", "block_keys", "masters", "address", "revoked_before_ms")
    class RevokedBeforeMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    MASTERS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    heartbeat_interval_ms: int
    leader: bool
    block_keys: str
    masters: _containers.RepeatedScalarFieldContainer[str]
    address: str
    revoked_before_ms: _containers.ScalarMap[str, int]
    def __init__(self, epoch: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., leader: _Optional[bool] = ..., block_keys: _Optional[str] = ..., masters: _Optional[_Iterable[str]] = ..., address: _Optional[str] = ..., revoked_before_ms: _Optional[_Mapping[str, int]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("header", "info")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    info: WorkerInfo
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., info: _Optional[_Union[WorkerInfo, _Mapping]] = ...) -> None: ...

class WorkerCommand(_message.Message):
    __slots__ = ("kind", "block_id", "targets", "task", "uri", "key", "upload_id", "part_size", "blocks", "file_size", "block_size", "refuse_writes_s")
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        KIND_UNSPECIFIED: _ClassVar[WorkerCommand.Kind]
        DELETE: _ClassVar[WorkerCommand.Kind]
        REPLICATE: _ClassVar[WorkerCommand.Kind]
        PERSIST: _ClassVar[WorkerCommand.Kind]
    KIND_UNSPECIFIED: WorkerCommand.Kind
    DELETE: WorkerCommand.Kind
    REPLICATE: WorkerCommand.Kind
    PERSIST: WorkerCommand.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_ID_FIELD_NUMBER: _ClassVar[int]
    PART_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    REFUSE_WRITES_S_FIELD_NUMBER: _ClassVar[int]
    kind: WorkerCommand.Kind
    block_id: int
    targets: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    task: int
    uri: str
    key: str
    upload_id: str
    part_size: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockLocation]
    file_size: int
    block_size: int
    refuse_writes_s: float
    def __init__(self, kind: _Optional[_Union[WorkerCommand.Kind, str]] = ..., block_id: _Optional[int] = ..., targets: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ..., task: _Optional[int] = ..., uri: _Optional[str] = ..., key: _Optional[str] = ..., upload_id: _Optional[str] = ..., part_size: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockLocation, _Mapping]]] = ..., file_size: _Optional[int] = ..., block_size: _Optional[int] = ..., refuse_writes_s: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("epoch", "reregister", "commands", "leader", "block_keys", "revoked_before_ms")
    class RevokedBeforeMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    BLOCK_KEYS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    reregister: bool
    commands: _containers.RepeatedCompositeFieldContainer[WorkerCommand]
    leader: bool
    block_keys: str
    revoked_before_ms: _containers.ScalarMap[str, int]
    def __init__(self, epoch: _Optional[int] = ..., reregister: _Optional[bool] = ..., commands: _Optional[_Iterable[_Union[WorkerCommand, _Mapping]]] = ..., leader: _Optional[bool] = ..., block_keys: _Optional[str] = ..., revoked_before_ms: _Optional[_Mapping[str, int]] = ...) -> None: ...

class BlockReport(_message.Message):
    __slots__ = ("header", "worker_id", "block_id", "length", "crc32c")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    worker_id: str
    block_id: int
    length: int
    crc32c: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., worker_id: _Optional[str] = ..., block_id: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("info", "alive", "last_heartbeat_age", "failed_copies", "failed_copy_error")
    INFO_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_FIELD_NUMBER: _ClassVar[int]
    FAILED_COPIES_FIELD_NUMBER: _ClassVar[int]
    FAILED_COPY_ERROR_FIELD_NUMBER: _ClassVar[int]
    info: WorkerInfo
    alive: bool
    last_heartbeat_age: float
    failed_copies: int
    failed_copy_error: str
    def __init__(self, info: _Optional[_Union[WorkerInfo, _Mapping]] = ..., alive: _Optional[bool] = ..., last_heartbeat_age: _Optional[float] = ..., failed_copies: _Optional[int] = ..., failed_copy_error: _Optional[str] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ("header", "any_master")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ANY_MASTER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    any_master: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., any_master: _Optional[bool] = ...) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("epoch", "workers", "under_replicated_blocks", "missing_blocks", "inodes", "blocks", "default_replication", "default_block_size", "corrupt_blocks", "damaged_files", "master", "tenants", "cached_bound_blocks", "evicted_blocks", "evicted_bytes", "blocks_without_target", "starting_left")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    UNDER_REPLICATED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MISSING_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INODES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_REPLICATION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FILES_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BOUND_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_WITHOUT_TARGET_FIELD_NUMBER: _ClassVar[int]
    STARTING_LEFT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    under_replicated_blocks: int
    missing_blocks: int
    inodes: int
    blocks: int
    default_replication: int
    default_block_size: int
    corrupt_blocks: int
    damaged_files: int
    master: MasterRole
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    cached_bound_blocks: int
    evicted_blocks: int
    evicted_bytes: int
    blocks_without_target: int
    starting_left: float
    def __init__(self, epoch: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., under_replicated_blocks: _Optional[int] = ..., missing_blocks: _Optional[int] = ..., inodes: _Optional[int] = ..., blocks: _Optional[int] = ..., default_replication: _Optional[int] = ..., default_block_size: _Optional[int] = ..., corrupt_blocks: _Optional[int] = ..., damaged_files: _Optional[int] = ..., master: _Optional[_Union[MasterRole, _Mapping]] = ..., tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ..., cached_bound_blocks: _Optional[int] = ..., evicted_blocks: _Optional[int] = ..., evicted_bytes: _Optional[int] = ..., blocks_without_target: _Optional[int] = ..., starting_left: _Optional[float] = ...) -> None: ...

class Tenant(_message.Message):
    __slots__ = ("name", "root", "quota_bytes", "quota_inodes", "used_bytes", "used_inodes", "reserved_bytes", "root_inode", "created", "revoked_before_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_INODES_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    USED_INODES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROOT_INODE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    REVOKED_BEFORE_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    root: str
    quota_bytes: int
    quota_inodes: int
    used_bytes: int
    used_inodes: int
    reserved_bytes: int
    root_inode: int
    created: float
    revoked_before_ms: int
    def __init__(self, name: _Optional[str] = ..., root: _Optional[str] = ..., quota_bytes: _Optional[int] = ..., quota_inodes: _Optional[int] = ..., used_bytes: _Optional[int] = ..., used_inodes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., root_inode: _Optional[int] = ..., created: _Optional[float] = ..., revoked_before_ms: _Optional[int] = ...) -> None: ...

class TenantRequest(_message.Message):
    __slots__ = ("header", "tenant", "token_ttl", "purge")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TTL_FIELD_NUMBER: _ClassVar[int]
    PURGE_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    tenant: Tenant
    token_ttl: float
    purge: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., tenant: _Optional[_Union[Tenant, _Mapping]] = ..., token_ttl: _Optional[float] = ..., purge: _Optional[bool] = ...) -> None: ...

class TenantResponse(_message.Message):
    __slots__ = ("tenant", "token")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    tenant: Tenant
    token: str
    def __init__(self, tenant: _Optional[_Union[Tenant, _Mapping]] = ..., token: _Optional[str] = ...) -> None: ...

class ListTenantsResponse(_message.Message):
    __slots__ = ("tenants",)
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    tenants: _containers.RepeatedCompositeFieldContainer[Tenant]
    def __init__(self, tenants: _Optional[_Iterable[_Union[Tenant, _Mapping]]] = ...) -> None: ...

class FollowerStatus(_message.Message):
    __slots__ = ("member", "address", "in_sync", "applied_index", "lag", "state", "last_contact_age", "gone_age")
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IN_SYNC_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_CONTACT_AGE_FIELD_NUMBER: _ClassVar[int]
    GONE_AGE_FIELD_NUMBER: _ClassVar[int]
    member: str
    address: str
    in_sync: bool
    applied_index: int
    lag: int
    state: str
    last_contact_age: float
    gone_age: float
    def __init__(self, member: _Optional[str] = ..., address: _Optional[str] = ..., in_sync: _Optional[bool] = ..., applied_index: _Optional[int] = ..., lag: _Optional[int] = ..., state: _Optional[str] = ..., last_contact_age: _Optional[float] = ..., gone_age: _Optional[float] = ...) -> None: ...

class MasterRole(_message.Message):
    __slots__ = ("role", "member", "address", "leader", "applied_index", "followers", "alone", "etcd_down", "may_not_lead")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    FOLLOWERS_FIELD_NUMBER: _ClassVar[int]
    ALONE_FIELD_NUMBER: _ClassVar[int]
    ETCD_DOWN_FIELD_NUMBER: _ClassVar[int]
    MAY_NOT_LEAD_FIELD_NUMBER: _ClassVar[int]
    role: str
    member: str
    address: str
    leader: str
    applied_index: int
    followers: _containers.RepeatedCompositeFieldContainer[FollowerStatus]
    alone: bool
    etcd_down: float
    may_not_lead: str
    def __init__(self, role: _Optional[str] = ..., member: _Optional[str] = ..., address: _Optional[str] = ..., leader: _Optional[str] = ..., applied_index: _Optional[int] = ..., followers: _Optional[_Iterable[_Union[FollowerStatus, _Mapping]]] = ..., alone: _Optional[bool] = ..., etcd_down: _Optional[float] = ..., may_not_lead: _Optional[str] = ...) -> None: ...

class KeyValue(_message.Message):
    __slots__ = ("key", "value")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    key: bytes
    value: bytes
    def __init__(self, key: _Optional[bytes] = ..., value: _Optional[bytes] = ...) -> None: ...

class LogEntry(_message.Message):
    __slots__ = ("index", "epoch", "puts", "deletes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PUTS_FIELD_NUMBER: _ClassVar[int]
    DELETES_FIELD_NUMBER: _ClassVar[int]
    index: int
    epoch: int
    puts: _containers.RepeatedCompositeFieldContainer[KeyValue]
    deletes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, index: _Optional[int] = ..., epoch: _Optional[int] = ..., puts: _Optional[_Iterable[_Union[KeyValue, _Mapping]]] = ..., deletes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AppendRequest(_message.Message):
    __slots__ = ("epoch", "leader", "prev_index", "prev_epoch", "entries")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    PREV_INDEX_FIELD_NUMBER: _ClassVar[int]
    PREV_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader: str
    prev_index: int
    prev_epoch: int
    entries: _containers.RepeatedCompositeFieldContainer[LogEntry]
    def __init__(self, epoch: _Optional[int] = ..., leader: _Optional[str] = ..., prev_index: _Optional[int] = ..., prev_epoch: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[LogEntry, _Mapping]]] = ...) -> None: ...

class AppendResponse(_message.Message):
    __slots__ = ("epoch", "ok", "applied_index", "applied_epoch", "member", "stream_port")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    STREAM_PORT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    ok: bool
    applied_index: int
    applied_epoch: int
    member: str
    stream_port: int
    def __init__(self, epoch: _Optional[int] = ..., ok: _Optional[bool] = ..., applied_index: _Optional[int] = ..., applied_epoch: _Optional[int] = ..., member: _Optional[str] = ..., stream_port: _Optional[int] = ...) -> None: ...

class CheckpointChunk(_message.Message):
    __slots__ = ("epoch", "leader", "index", "index_epoch", "name", "data", "done")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    INDEX_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader: str
    index: int
    index_epoch: int
    name: str
    data: bytes
    done: bool
    def __init__(self, epoch: _Optional[int] = ..., leader: _Optional[str] = ..., index: _Optional[int] = ..., index_epoch: _Optional[int] = ..., name: _Optional[str] = ..., data: _Optional[bytes] = ..., done: _Optional[bool] = ...) -> None: ...

class MemberRequest(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class DedupRecord(_message.Message):
    __slots__ = ("method", "reply", "time")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    method: str
    reply: bytes
    time: float
    def __init__(self, method: _Optional[str] = ..., reply: _Optional[bytes] = ..., time: _Optional[float] = ...) -> None: ...

class FsckRequest(_message.Message):
    __slots__ = ("header", "path")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    path: str
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., path: _Optional[str] = ...) -> None: ...

class DamagedBlock(_message.Message):
    __slots__ = ("path", "index", "block_id", "offset", "length", "state", "good", "quarantined", "crc32c", "token", "dead")
    PATH_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GOOD_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEAD_FIELD_NUMBER: _ClassVar[int]
    path: str
    index: int
    block_id: int
    offset: int
    length: int
    state: str
    good: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    quarantined: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    crc32c: int
    token: str
    dead: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    def __init__(self, path: _Optional[str] = ..., index: _Optional[int] = ..., block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., state: _Optional[str] = ..., good: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ..., quarantined: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ..., crc32c: _Optional[int] = ..., token: _Optional[str] = ..., dead: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ...) -> None: ...

class FsckReport(_message.Message):
    __slots__ = ("files", "blocks", "damaged")
    FILES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DAMAGED_FIELD_NUMBER: _ClassVar[int]
    files: int
    blocks: int
    damaged: _containers.RepeatedCompositeFieldContainer[DamagedBlock]
    def __init__(self, files: _Optional[int] = ..., blocks: _Optional[int] = ..., damaged: _Optional[_Iterable[_Union[DamagedBlock, _Mapping]]] = ...) -> None: ...

class IncrementalBlockReport(_message.Message):
    __slots__ = ("header", "worker_id", "lost", "corrupt", "failed", "received")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    CORRUPT_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    worker_id: str
    lost: _containers.RepeatedScalarFieldContainer[int]
    corrupt: _containers.RepeatedScalarFieldContainer[int]
    failed: _containers.RepeatedCompositeFieldContainer[ReplicationFailure]
    received: _containers.RepeatedCompositeFieldContainer[BlockReport]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., worker_id: _Optional[str] = ..., lost: _Optional[_Iterable[int]] = ..., corrupt: _Optional[_Iterable[int]] = ..., failed: _Optional[_Iterable[_Union[ReplicationFailure, _Mapping]]] = ..., received: _Optional[_Iterable[_Union[BlockReport, _Mapping]]] = ...) -> None: ...

class ReplicationFailure(_message.Message):
    __slots__ = ("block_id", "targets", "error")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    targets: _containers.RepeatedScalarFieldContainer[str]
    error: str
    def __init__(self, block_id: _Optional[int] = ..., targets: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ...) -> None: ...

class Empty(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BatchOp(_message.Message):
    __slots__ = ("stat", "create", "layout", "allocate", "commit")
    STAT_FIELD_NUMBER: _ClassVar[int]
    CREATE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATE_FIELD_NUMBER: _ClassVar[int]
    COMMIT_FIELD_NUMBER: _ClassVar[int]
    stat: PathRequest
    create: CreateRequest
    layout: LayoutRequest
    allocate: AllocateBlockRequest
    commit: CommitFileRequest
    def __init__(self, stat: _Optional[_Union[PathRequest, _Mapping]] = ..., create: _Optional[_Union[CreateRequest, _Mapping]] = ..., layout: _Optional[_Union[LayoutRequest, _Mapping]] = ..., allocate: _Optional[_Union[AllocateBlockRequest, _Mapping]] = ..., commit: _Optional[_Union[CommitFileRequest, _Mapping]] = ...) -> None: ...

class BatchRequest(_message.Message):
    __slots__ = ("header", "ops")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OPS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    ops: _containers.RepeatedCompositeFieldContainer[BatchOp]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., ops: _Optional[_Iterable[_Union[BatchOp, _Mapping]]] = ...) -> None: ...

class BatchResult(_message.Message):
    __slots__ = ("inode", "error", "message", "layout", "location")
    INODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    inode: Inode
    error: str
    message: str
    layout: FileLayout
    location: BlockLocation
    def __init__(self, inode: _Optional[_Union[Inode, _Mapping]] = ..., error: _Optional[str] = ..., message: _Optional[str] = ..., layout: _Optional[_Union[FileLayout, _Mapping]] = ..., location: _Optional[_Union[BlockLocation, _Mapping]] = ...) -> None: ...

class BatchResponse(_message.Message):
    __slots__ = ("results", "epoch")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchResult]
    epoch: int
    def __init__(self, results: _Optional[_Iterable[_Union[BatchResult, _Mapping]]] = ..., epoch: _Optional[int] = ...) -> None: ...

class Bind(_message.Message):
    __slots__ = ("path", "uri", "mode", "meta_ttl", "created", "tenant", "inode")
    PATH_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    META_TTL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    INODE_FIELD_NUMBER: _ClassVar[int]
    path: str
    uri: str
    mode: str
    meta_ttl: float
    created: float
    tenant: str
    inode: int
    def __init__(self, path: _Optional[str] = ..., uri: _Optional[str] = ..., mode: _Optional[str] = ..., meta_ttl: _Optional[float] = ..., created: _Optional[float] = ..., tenant: _Optional[str] = ..., inode: _Optional[int] = ...) -> None: ...

class BindRequest(_message.Message):
    __slots__ = ("header", "bind", "check", "force")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BIND_FIELD_NUMBER: _ClassVar[int]
    CHECK_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    bind: Bind
    check: bool
    force: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., bind: _Optional[_Union[Bind, _Mapping]] = ..., check: _Optional[bool] = ..., force: _Optional[bool] = ...) -> None: ...

class BindList(_message.Message):
    __slots__ = ("binds",)
    BINDS_FIELD_NUMBER: _ClassVar[int]
    binds: _containers.RepeatedCompositeFieldContainer[Bind]
    def __init__(self, binds: _Optional[_Iterable[_Union[Bind, _Mapping]]] = ...) -> None: ...

class FreeReport(_message.Message):
    __slots__ = ("files", "blocks", "bytes")
    FILES_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    files: int
    blocks: int
    bytes: int
    def __init__(self, files: _Optional[int] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ...) -> None: ...

class SpaceRequest(_message.Message):
    __slots__ = ("header", "worker_id", "bytes", "block_id")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    worker_id: str
    bytes: int
    block_id: int
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., worker_id: _Optional[str] = ..., bytes: _Optional[int] = ..., block_id: _Optional[int] = ...) -> None: ...

class SpaceResponse(_message.Message):
    __slots__ = ("evict", "bytes")
    EVICT_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    evict: _containers.RepeatedScalarFieldContainer[int]
    bytes: int
    def __init__(self, evict: _Optional[_Iterable[int]] = ..., bytes: _Optional[int] = ...) -> None: ...

class UfsSource(_message.Message):
    __slots__ = ("uri", "key", "etag", "offset", "length", "block_id", "error", "message")
    URI_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    uri: str
    key: str
    etag: str
    offset: int
    length: int
    block_id: int
    error: str
    message: str
    def __init__(self, uri: _Optional[str] = ..., key: _Optional[str] = ..., etag: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., block_id: _Optional[int] = ..., error: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class UfsSourceRequest(_message.Message):
    __slots__ = ("header", "worker_id", "block_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    worker_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., worker_id: _Optional[str] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class UfsSourceList(_message.Message):
    __slots__ = ("sources",)
    SOURCES_FIELD_NUMBER: _ClassVar[int]
    sources: _containers.RepeatedCompositeFieldContainer[UfsSource]
    def __init__(self, sources: _Optional[_Iterable[_Union[UfsSource, _Mapping]]] = ...) -> None: ...

class FetchItem(_message.Message):
    __slots__ = ("block_id", "token", "length", "error", "message")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    token: str
    length: int
    error: str
    message: str
    def __init__(self, block_id: _Optional[int] = ..., token: _Optional[str] = ..., length: _Optional[int] = ..., error: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class DataHeader(_message.Message):
    __slots__ = ("op", "block_id", "offset", "length", "crc32c", "pipeline", "token", "epoch", "error", "message", "chunk_crcs", "replicas", "write_handle", "block_length", "fetches")
    OP_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    CRC32C_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_CRCS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WRITE_HANDLE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_LENGTH_FIELD_NUMBER: _ClassVar[int]
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    op: DataOp
    block_id: int
    offset: int
    length: int
    crc32c: int
    pipeline: _containers.RepeatedCompositeFieldContainer[WorkerAddr]
    token: str
    epoch: int
    error: str
    message: str
    chunk_crcs: _containers.RepeatedScalarFieldContainer[int]
    replicas: _containers.RepeatedScalarFieldContainer[str]
    write_handle: str
    block_length: int
    fetches: _containers.RepeatedCompositeFieldContainer[FetchItem]
    def __init__(self, op: _Optional[_Union[DataOp, str]] = ..., block_id: _Optional[int] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ..., crc32c: _Optional[int] = ..., pipeline: _Optional[_Iterable[_Union[WorkerAddr, _Mapping]]] = ..., token: _Optional[str] = ..., epoch: _Optional[int] = ..., error: _Optional[str] = ..., message: _Optional[str] = ..., chunk_crcs: _Optional[_Iterable[int]] = ..., replicas: _Optional[_Iterable[str]] = ..., write_handle: _Optional[str] = ..., block_length: _Optional[int] = ..., fetches: _Optional[_Iterable[_Union[FetchItem, _Mapping]]] = ...) -> None: ...
