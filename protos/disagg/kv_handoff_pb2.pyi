from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("request_id", "block_ids", "max_chunk_bytes", "consumer_id", "attempt")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    max_chunk_bytes: int
    consumer_id: str
    attempt: int
    def __init__(
        self,
        request_id: str | None = ...,
        block_ids: _Iterable[int] | None = ...,
        max_chunk_bytes: int | None = ...,
        consumer_id: str | None = ...,
        attempt: int | None = ...,
    ) -> None: ...

class BlockChunk(_message.Message):
    __slots__ = ("pieces",)
    PIECES_FIELD_NUMBER: _ClassVar[int]
    pieces: _containers.RepeatedCompositeFieldContainer[BlockPiece]
    def __init__(self, pieces: _Iterable[BlockPiece | _Mapping] | None = ...) -> None: ...

class BlockPiece(_message.Message):
    __slots__ = ("block_id", "block_index", "block_bytes", "crc32", "offset", "data")
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    block_id: int
    block_index: int
    block_bytes: int
    crc32: int
    offset: int
    data: bytes
    def __init__(
        self,
        block_id: int | None = ...,
        block_index: int | None = ...,
        block_bytes: int | None = ...,
        crc32: int | None = ...,
        offset: int | None = ...,
        data: bytes | None = ...,
    ) -> None: ...

class DoneRequest(_message.Message):
    __slots__ = ("request_id", "success", "consumer_id", "reason")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    success: bool
    consumer_id: str
    reason: str
    def __init__(
        self,
        request_id: str | None = ...,
        success: bool | None = ...,
        consumer_id: str | None = ...,
        reason: str | None = ...,
    ) -> None: ...

class DoneAck(_message.Message):
    __slots__ = ("first_report",)
    FIRST_REPORT_FIELD_NUMBER: _ClassVar[int]
    first_report: bool
    def __init__(self, first_report: bool | None = ...) -> None: ...

class HealthCheckRequest(_message.Message):
    __slots__ = ("service",)
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    service: str
    def __init__(self, service: str | None = ...) -> None: ...

class HealthCheckResponse(_message.Message):
    __slots__ = ("status",)
    class ServingStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        UNKNOWN: _ClassVar[HealthCheckResponse.ServingStatus]
        SERVING: _ClassVar[HealthCheckResponse.ServingStatus]
        NOT_SERVING: _ClassVar[HealthCheckResponse.ServingStatus]

    UNKNOWN: HealthCheckResponse.ServingStatus
    SERVING: HealthCheckResponse.ServingStatus
    NOT_SERVING: HealthCheckResponse.ServingStatus
    STATUS_FIELD_NUMBER: _ClassVar[int]
    status: HealthCheckResponse.ServingStatus
    def __init__(self, status: HealthCheckResponse.ServingStatus | str | None = ...) -> None: ...
