# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled twins of the per-request byte path (Cython). The readable reference is the pure Python
beside each one: `protocol.framing`, `protocol.headers`, `protocol.produce`, `protocol.throttle`.

The rule that keeps the two identical: the compiled code handles the common, well-formed case in C
(fixed offsets, one-byte varints, empty tag sections) and hands anything else (a truncated or
malformed frame, a rare layout, an unverified version) to the pure-Python function, which then
decides, raises or answers exactly as it always did. `protocol.fastpath` picks the implementation;
tests/unit/differential feeds the same bytes to both.

No I/O, no asyncio: this is part of the sans-IO `protocol` package.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize, PyByteArray_GET_SIZE
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_STRIDES
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.string cimport memcmp, memcpy, memmove
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, uint8_t, uint16_t, uint32_t

from protocol._walk cimport count_records as _walk_count_records
from protocol._walk cimport read_compact_length, read_topic_id, read_topic_name
from protocol._walk cimport read_i16 as _i16
from protocol._walk cimport read_i32 as _i32
from protocol._slots cimport fill, offsets_of

from protocol import framing as _framing
from protocol import headers as _headers
from protocol import produce as _produce
from protocol import throttle as _throttle
from protocol.apis import FLEXIBLE_SINCE
from protocol.errors import DecodeError, FrameTooLarge

cdef object _RequestHeader = _headers.RequestHeader
cdef object _pure_read_request_header = _headers.read_request_header
cdef object _pure_read_response_correlation_id = _headers.read_response_correlation_id
cdef object _pure_read_produce_acks = _produce.read_produce_acks
cdef object _pure_throttle_time_offset = _throttle.throttle_time_offset
cdef object _pure_plan_throttle_patch = _throttle.plan_throttle_patch
cdef object _pure_patch_throttle_time = _throttle.patch_throttle_time

cdef int32_t INT32_MAX = 0x7FFFFFFF

# `RequestHeader(...)` without its generated __init__ (a Python function, entered per request):
# the slots filled in C (protocol/_slots.pxd), in the dataclass's field order, which is checked here
cdef object _object_new = object.__new__
_HEADER_FIELDS = ("api_key", "api_version", "correlation_id", "client_id", "header_version", "body_offset")
if tuple(_RequestHeader.__dataclass_fields__) != _HEADER_FIELDS:
    raise ImportError(f"RequestHeader's fields are {tuple(_RequestHeader.__dataclass_fields__)}, "
                      f"not the {_HEADER_FIELDS} this module fills")
cdef Py_ssize_t _header_offsets[6]
offsets_of(_RequestHeader, _HEADER_FIELDS, _header_offsets, 6)


cdef object _new_header(int api_key, int api_version, int32_t correlation_id, object client_id,
                        int header_version, Py_ssize_t body_offset):
    """`RequestHeader(api_key, api_version, correlation_id, client_id, header_version, body_offset)`."""
    header = _object_new(_RequestHeader)
    fill(header, _header_offsets, (api_key, api_version, correlation_id, client_id, header_version, body_offset))
    return header
DEFAULT_MAX_FRAME_BYTES = _framing.DEFAULT_MAX_FRAME_BYTES

# --- tables, built once from the pure modules' own tables ---------------------------------------
# FLEXIBLE_SINCE per api key (-1: never flexible or unknown); the throttle field's "first body
# field since" version (-1: not a first-field API); the highest verified response version.
DEF N_KEYS = 128
cdef int _flexible_since[N_KEYS]
cdef int _first_field_since[N_KEYS]
cdef int _max_response_version[N_KEYS]

cdef void _init_tables():
    cdef int k
    for k in range(N_KEYS):
        _flexible_since[k] = -1
        _first_field_since[k] = -1
        _max_response_version[k] = -1
    for key, since in FLEXIBLE_SINCE.items():
        if 0 <= key < N_KEYS and since is not None:
            _flexible_since[key] = since
    for key, since in _throttle._FIRST_FIELD_SINCE.items():
        if 0 <= key < N_KEYS:
            _first_field_since[key] = since
    for key, version in _throttle.MAX_KNOWN_RESPONSE_VERSION.items():
        if 0 <= key < N_KEYS:
            _max_response_version[key] = version

_init_tables()

DEF PRODUCE = 0
DEF FETCH = 1
DEF CONTROLLED_SHUTDOWN = 7
DEF API_VERSIONS = 18


cdef inline bint _flexible(int api_key, int api_version) noexcept nogil:
    if api_key < 0 or api_key >= N_KEYS:
        return False
    cdef int since = _flexible_since[api_key]
    return since >= 0 and api_version >= since


# --- framing ------------------------------------------------------------------------------------


cdef Py_ssize_t READ_BYTES = _framing.READ_BYTES
cdef Py_ssize_t MAX_ROOM_BYTES = _framing.MAX_ROOM_BYTES
cdef Py_ssize_t KEPT_BYTES = _framing.KEPT_BYTES
DEF PAGE = 4096
cdef char* _UNSIGNED_BYTE = b"B"  # the exported room's format (a module constant: never freed)


cdef class ReadRoom


cdef class FrameSplitter:
    """`protocol.framing.FrameSplitter` in C: one kept buffer, two offsets, C integer reads.

    Same contract, room and errors as the pure class (see there); a frame leaves as one `bytes`
    copy. `get_buffer` returns the splitter's one `ReadRoom`, which exports the room after the
    buffered bytes through the buffer protocol: no object is made per read.
    """

    cdef bytearray _buf  # its size is the capacity: bytes past _end are room
    cdef Py_ssize_t _pos  # start of the unconsumed bytes
    cdef Py_ssize_t _end  # end of the bytes read
    cdef Py_ssize_t _max_frame_bytes
    cdef ReadRoom _room  # what get_buffer returns: the room, exported

    def __init__(self, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES):
        if not 0 <= max_frame_bytes <= INT32_MAX:
            raise ValueError(f"max_frame_bytes must be in [0, {INT32_MAX}], not {max_frame_bytes}")
        self._max_frame_bytes = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0
        self._end = 0
        self._room = ReadRoom(self)

    @property
    def buffered_bytes(self):
        return self._end - self._pos

    @property
    def capacity_bytes(self):
        return PyByteArray_GET_SIZE(self._buf)

    def feed(self, data):
        cdef Py_ssize_t n
        if type(data) is not bytes:  # any other buffer: copied through the buffer protocol
            with memoryview(data) as view:
                n = view.nbytes
                self._make_room(n)
                self._buf[self._end : self._end + n] = view
            self._end += n
            return
        n = PyBytes_GET_SIZE(data)
        self._make_room(n)
        memcpy(PyByteArray_AS_STRING(self._buf) + self._end, PyBytes_AS_STRING(data), n)
        self._end += n

    def get_buffer(self, sizehint=-1):
        cdef Py_ssize_t unread = self._end - self._pos
        cdef Py_ssize_t want = READ_BYTES - unread if READ_BYTES - unread > 1 else 1
        cdef Py_ssize_t size = self._peek_size()
        cdef Py_ssize_t rest
        if size >= 0:
            rest = 4 + size - unread
            if rest > MAX_ROOM_BYTES:
                rest = MAX_ROOM_BYTES
            if rest > want:
                want = rest
        self._make_room(want)
        return self._room

    def buffer_updated(self, Py_ssize_t nbytes):
        cdef Py_ssize_t room = PyByteArray_GET_SIZE(self._buf) - self._end
        if not 0 <= nbytes <= room:
            raise ValueError(f"{nbytes} bytes read into a room of {room}")
        self._end += nbytes

    def next_frame(self):
        cdef Py_ssize_t size = self._front_size()
        cdef Py_ssize_t start = self._pos + 4
        if size < 0 or self._end < start + size:
            return None
        return self._consume(start, start + size)

    def pending_frame(self, Py_ssize_t head_bytes):
        cdef Py_ssize_t size = self._front_size()
        cdef Py_ssize_t start = self._pos + 4
        cdef Py_ssize_t head = size if size < head_bytes else head_bytes
        if size < 0 or self._end < start + head:
            return None
        return size, PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self._buf) + start, head)

    def take_partial(self):
        cdef Py_ssize_t size = self._front_size()
        assert size >= 0, "take_partial before the size prefix arrived"
        cdef Py_ssize_t start = self._pos + 4
        cdef bytes part = self._consume(start, start + size if start + size < self._end else self._end)
        return part, size - PyBytes_GET_SIZE(part)

    def unread(self, payloads):
        cdef bytes head = b"".join([(<int32_t>len(p)).to_bytes(4, "big") + p for p in payloads])
        cdef Py_ssize_t k = PyBytes_GET_SIZE(head)
        if not k:
            return
        cdef Py_ssize_t pos = self._pos
        if pos >= k:
            memcpy(PyByteArray_AS_STRING(self._buf) + pos - k, PyBytes_AS_STRING(head), k)
            self._pos = pos - k
        else:
            self._buf = bytearray(head) + self._buf[pos:]
            self._end += k - pos
            self._pos = 0

    cdef Py_ssize_t _front_size(self) except -2:
        """The front frame's size once its prefix has arrived (checked), else -1."""
        cdef Py_ssize_t pos = self._pos
        if self._end - pos < 4:
            return -1
        cdef int32_t size = _i32(<const uint8_t*>PyByteArray_AS_STRING(self._buf) + pos)
        if size < 0:
            raise DecodeError(f"negative frame size {size}", pos)
        if size > self._max_frame_bytes:
            raise FrameTooLarge(size, self._max_frame_bytes)
        return size

    cdef Py_ssize_t _peek_size(self):
        """The front frame's size if its prefix has arrived and is valid, else -1 (nothing raised)."""
        if self._end - self._pos < 4:
            return -1
        cdef int32_t size = _i32(<const uint8_t*>PyByteArray_AS_STRING(self._buf) + self._pos)
        return size if 0 <= size <= self._max_frame_bytes else -1

    cdef int _make_room(self, Py_ssize_t room) except -1:
        """`FrameSplitter._make_room`: the unread bytes to the front, or a new buffer (never a resize
        in place)."""
        cdef bytearray buf = self._buf
        cdef Py_ssize_t capacity = PyByteArray_GET_SIZE(buf)
        if capacity - self._end >= room:
            return 0
        cdef Py_ssize_t unread = self._end - self._pos
        cdef Py_ssize_t size
        if unread + room <= capacity:
            memmove(PyByteArray_AS_STRING(buf), PyByteArray_AS_STRING(buf) + self._pos, unread)
        else:
            size = unread + room
            if size < 2 * capacity:
                size = 2 * capacity
            size = (size + PAGE - 1) // PAGE * PAGE
            grown = <bytearray>PyByteArray_FromStringAndSize(NULL, size)  # not zeroed: only read after written
            memcpy(PyByteArray_AS_STRING(grown), PyByteArray_AS_STRING(buf) + self._pos, unread)
            self._buf = grown
        self._pos = 0
        self._end = unread
        return 0

    cdef bytes _consume(self, Py_ssize_t start, Py_ssize_t end):
        cdef bytes out = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self._buf) + start, end - start)
        if end == self._end:
            self._pos = 0
            self._end = 0
            if PyByteArray_GET_SIZE(self._buf) > KEPT_BYTES:
                self._buf = bytearray()
        else:
            self._pos = end
        return out


cdef class ReadRoom:
    """The room after a compiled `FrameSplitter`'s buffered bytes, as a writable buffer (what its
    `get_buffer` returns, one per splitter). `len()` is the room's size, and it is sliced and written
    like a memoryview of the room. While it is exported the buffer it lies in is held here, so the splitter replacing its buffer meanwhile leaves it valid."""

    cdef FrameSplitter _splitter
    cdef bytearray _exported  # the buffer whose room is exported ...
    cdef Py_ssize_t _exports  # ... and how many times

    def __init__(self, FrameSplitter splitter):
        self._splitter = splitter

    def __len__(self):
        return PyByteArray_GET_SIZE(self._splitter._buf) - self._splitter._end

    def __getitem__(self, key):  # a slice of the room, as a memoryview's (asyncio's TLS reads into one)
        return memoryview(self)[key]

    def __setitem__(self, key, value):  # asyncio's `_feed_data_to_buffered_proto` writes so
        memoryview(self)[key] = value

    def __getbuffer__(self, Py_buffer* view, int flags):
        """`PyBuffer_FillInfo`'s fields: one dimension of unsigned bytes, writable."""
        cdef FrameSplitter splitter = self._splitter
        cdef bytearray buf = splitter._buf
        view.buf = PyByteArray_AS_STRING(buf) + splitter._end
        view.obj = self
        view.len = PyByteArray_GET_SIZE(buf) - splitter._end
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = _UNSIGNED_BYTE
        view.ndim = 1
        view.shape = &view.len if flags & PyBUF_ND else NULL
        view.strides = &view.itemsize if flags & PyBUF_STRIDES == PyBUF_STRIDES else NULL
        view.suboffsets = NULL
        view.internal = NULL
        if self._exports == 0:
            self._exported = buf
        self._exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self._exports -= 1
        if self._exports == 0:
            self._exported = None


# --- headers ------------------------------------------------------------------------------------


cdef object _last_client_id = ""  # the client-id decoded last: most requests repeat their predecessor's


cdef object _client_id(const uint8_t* p, Py_ssize_t n):
    """`bytes(p[:n]).decode("utf-8", "replace")`: the last call's string again when the bytes are its
    UTF-8 (valid UTF-8 decodes to one string only), else decoded afresh."""
    global _last_client_id
    cdef Py_ssize_t last_n
    cdef const char* last = PyUnicode_AsUTF8AndSize(_last_client_id, &last_n)
    if last_n == n and memcmp(last, p, n) == 0:
        return _last_client_id
    decoded = PyUnicode_DecodeUTF8(<const char*>p, n, "replace")
    _last_client_id = decoded
    return decoded


def read_request_header(payload):
    """`protocol.headers.read_request_header`: the usual header in C, anything else by the original."""
    if type(payload) is not bytes:
        return _pure_read_request_header(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    if n < 10:
        return _pure_read_request_header(payload)
    cdef int api_key = _i16(p)
    cdef int api_version = _i16(p + 2)
    cdef int32_t correlation_id = _i32(p + 4)
    cdef int client_id_len = _i16(p + 8)
    if api_version < 0 or client_id_len < -1 or (api_key == CONTROLLED_SHUTDOWN and api_version == 0):
        return _pure_read_request_header(payload)
    cdef Py_ssize_t pos = 10
    cdef object client_id = None
    if client_id_len >= 0:
        pos += client_id_len
        if pos > n:
            return _pure_read_request_header(payload)
        client_id = _client_id(p + 10, client_id_len)
    cdef int header_version = 1
    if _flexible(api_key, api_version):
        header_version = 2
        if pos >= n or p[pos] != 0:  # a tag section with fields: the original walks it
            return _pure_read_request_header(payload)
        pos += 1
    return _new_header(api_key, api_version, correlation_id, client_id, header_version, pos)


def read_response_correlation_id(payload):
    if type(payload) is not bytes or PyBytes_GET_SIZE(payload) < 4:
        return _pure_read_response_correlation_id(payload)
    return _i32(<const uint8_t*>PyBytes_AS_STRING(payload))


def read_produce_acks(payload, header):
    """`protocol.produce.read_produce_acks`: v0-v8 (int16 transactional_id lengths) and v9+
    (one-byte compact lengths) in C."""
    if type(payload) is not bytes or header.api_key != PRODUCE:
        return _pure_read_produce_acks(payload, header)
    cdef int version = header.api_version
    cdef Py_ssize_t pos = header.body_offset
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef int length
    if 0 <= version <= 8:
        if version >= 3:  # transactional_id: int16 length, -1 = null
            if pos < 0 or pos + 2 > n:
                return _pure_read_produce_acks(payload, header)
            length = _i16(p + pos)
            if length < -1:
                return _pure_read_produce_acks(payload, header)
            pos += 2 + (length if length > 0 else 0)
        if pos < 0 or pos + 2 > n:
            return _pure_read_produce_acks(payload, header)
        return _i16(p + pos)
    if version < 9 or version > 13 or pos >= n or p[pos] >= 0x80:
        return _pure_read_produce_acks(payload, header)
    length = p[pos]  # compact nullable string: length + 1, 0 = null
    pos += 1 + (length - 1 if length > 0 else 0)
    if pos + 2 > n:
        return _pure_read_produce_acks(payload, header)
    return _i16(p + pos)


cdef inline bint _small(object v):
    """A plain int that fits the int16 of an api key or version (anything else: the pure code)."""
    return type(v) is int and -0x8000 <= v <= 0x7FFF


# --- throttle_time_ms ---------------------------------------------------------------------------


cdef Py_ssize_t _produce_flexible_offset(const uint8_t* p, Py_ssize_t n, Py_ssize_t body,
                                         int api_version) noexcept nogil:
    """The v9+ Produce walk for the common case (see `throttle._produce_walk_flexible`), or -1 when
    anything is not the common case (then the pure walk decides)."""
    cdef Py_ssize_t pos = body
    cdef int n_topics, n_parts, t, i, byte
    if pos >= n or p[pos] >= 0x80:
        return -1
    n_topics = p[pos] - 1
    pos += 1
    for t in range(n_topics):
        if api_version >= 13:
            pos += 16
        else:
            if pos >= n or p[pos] >= 0x80:
                return -1
            byte = p[pos]
            pos += byte if byte > 1 else 1
        if pos >= n or p[pos] >= 0x80:
            return -1
        n_parts = p[pos] - 1
        pos += 1
        for i in range(n_parts):
            pos += 30
            # record_errors empty, error_message null, partition tags empty
            if pos + 3 > n or p[pos] != 1 or p[pos + 1] != 0 or p[pos + 2] != 0:
                return -1
            pos += 3
        if pos >= n or p[pos] != 0:  # topic tags
            return -1
        pos += 1
    # throttle_time_ms, then the response's tag section (empty) ending the payload exactly
    if pos + 5 != n or p[pos + 4] != 0:
        return -1
    return pos


DEF UNSUPPORTED_VERSION = 35  # an ApiVersions answer with this error may be in the v0 layout


cdef Py_ssize_t _api_versions_offset(const uint8_t* p, Py_ssize_t n, int api_version) noexcept nogil:
    """The ApiVersions walk (`throttle._api_versions_offset`; its header is v0 at every version) for
    the common case: no error (an UNSUPPORTED_VERSION answer may be the v0 fallback, which the pure
    code tells apart) and, from v3, entries with empty tag sections; -1: no field (v0); -2 for
    anything else (then the pure walk decides, or raises)."""
    if n < 6 or _i16(p + 4) == UNSUPPORTED_VERSION:
        return -2
    if api_version == 0:
        return -1
    cdef Py_ssize_t pos
    cdef long long count
    cdef Py_ssize_t i
    if api_version >= 3:  # error_code, then a compact array of (api_key, min, max, tags)
        pos = _uvarint(p, n, 6, &count)
        if pos < 0:
            return -2
        count = count - 1 if count > 0 else 0
        if count * 7 > n - pos:
            return -2
        for i in range(count):
            pos += 6
            if pos >= n or p[pos] != 0:  # a tagged field: the pure code
                return -2
            pos += 1
    else:  # error_code, then an int32 count of 6-byte entries
        if n < 10:
            return -2
        count = _i32(p + 6)
        if count < -1:
            return -2
        pos = 10
        if count > 0:
            if count * 6 > n - pos:
                return -2
            pos += 6 * count
    if pos + 4 > n:
        return -2
    return pos


cdef Py_ssize_t _offset(const uint8_t* p, Py_ssize_t n, int api_key, int api_version) noexcept nogil:
    """throttle_time_ms's offset; -1: no field in this version; -2: ask the pure code."""
    if api_key < 0 or api_key >= N_KEYS:
        return -2
    cdef int max_version = _max_response_version[api_key]
    if max_version < 0 or api_version < 0 or api_version > max_version or n < 4:
        return -2
    if api_key == API_VERSIONS:
        return _api_versions_offset(p, n, api_version)
    cdef Py_ssize_t body = 4
    cdef bint flexible = _flexible(api_key, api_version)
    if flexible:
        if n < 5 or p[4] != 0:
            return -2
        body = 5
    cdef int since = _first_field_since[api_key]
    cdef Py_ssize_t offset
    if since >= 0:
        if api_version < since:
            return -1
        offset = body
    elif api_key == PRODUCE:
        if api_version == 0:
            return -1
        if api_version <= 8:
            offset = n - 4
            if offset < body + 4:
                return -2
            return offset
        offset = _produce_flexible_offset(p, n, body, api_version)
        if offset < 0:
            return -2
    else:
        return -2
    if offset + 4 > n:
        return -2
    return offset


def throttle_time_offset(payload, api_key, api_version):
    if type(payload) is not bytes or not (_small(api_key) and _small(api_version)):
        return _pure_throttle_time_offset(payload, api_key, api_version)
    cdef Py_ssize_t offset = _offset(<const uint8_t*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload),
                                     api_key, api_version)
    if offset == -2:
        return _pure_throttle_time_offset(payload, api_key, api_version)
    return None if offset == -1 else offset


def plan_throttle_patch(payload, api_key, api_version, throttle_time_ms):
    if type(payload) is not bytes or not (_small(api_key) and _small(api_version)):
        return _pure_plan_throttle_patch(payload, api_key, api_version, throttle_time_ms)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t offset = _offset(p, PyBytes_GET_SIZE(payload), api_key, api_version)
    if offset == -2:
        return _pure_plan_throttle_patch(payload, api_key, api_version, throttle_time_ms)
    if offset == -1:
        return None
    cdef int32_t current = _i32(p + offset)
    wanted = throttle_time_ms if throttle_time_ms < INT32_MAX else INT32_MAX
    if wanted <= current:
        return None
    return offset, (<int32_t>wanted).to_bytes(4, "big", signed=True)


def patch_throttle_time(payload, api_key, api_version, throttle_time_ms):
    """`protocol.throttle.patch_throttle_time`: one copy, the 4 bytes written in place."""
    if type(payload) is not bytes:
        return _pure_patch_throttle_time(payload, api_key, api_version, throttle_time_ms)
    patch = plan_throttle_patch(payload, api_key, api_version, throttle_time_ms)
    if patch is None:
        return payload
    cdef Py_ssize_t offset = patch[0]
    cdef bytes new_bytes = patch[1]
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef bytes out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(payload), n)
    cdef char* q = PyBytes_AS_STRING(out)  # fresh and unshared: writing it before anyone sees it is safe
    cdef const char* src = PyBytes_AS_STRING(new_bytes)
    q[offset] = src[0]
    q[offset + 1] = src[1]
    q[offset + 2] = src[2]
    q[offset + 3] = src[3]
    return out


# --- KIP-951 leader endpoints: is the top-level tag section empty? (protocol.rewrite) ----------

from protocol import rewrite as _rewrite

cdef object _pure_node_endpoints_absent = _rewrite.node_endpoints_absent
cdef int _PRODUCE_REWRITE_MAX = _rewrite.PARSEABLE_MAX_VERSIONS[PRODUCE]
cdef int _FETCH_REWRITE_MAX = _rewrite.PARSEABLE_MAX_VERSIONS[FETCH]


cdef bint _fetch_tags_empty(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """A Fetch v16+ response in its usual shape (one-byte array lengths, record sets under 2 MiB,
    empty partition and topic tag sections) walked to its end, whose tag section is empty and ends
    the payload exactly. False means "not shown here": the reference decides."""
    cdef Py_ssize_t pos = 15  # correlation id, empty header tags, throttle_time_ms, error_code, session_id
    cdef Py_ssize_t length
    cdef int n_topics, n_parts, n_aborted, t, i, a
    if n < 17 or p[4] != 0 or p[pos] == 0 or p[pos] >= 0x80:
        return False
    n_topics = p[pos] - 1
    pos += 1
    for t in range(n_topics):
        pos += 16  # topic_id
        if pos >= n or p[pos] == 0 or p[pos] >= 0x80:
            return False
        n_parts = p[pos] - 1
        pos += 1
        for i in range(n_parts):
            # index, error_code, high_watermark, last_stable_offset, log_start_offset
            pos += 30
            if pos >= n or p[pos] >= 0x80:
                return False
            n_aborted = p[pos] - 1 if p[pos] > 1 else 0  # 0: null, 1: empty
            pos += 1
            for a in range(n_aborted):  # producer_id, first_offset, empty tags
                if pos + 17 > n or p[pos + 16] != 0:
                    return False
                pos += 17
            pos += 4  # preferred_read_replica
            if pos + 3 > n:
                return False
            length = read_compact_length(p, &pos)
            if length < 0:
                return False
            pos += length
            if pos >= n or p[pos] != 0:  # partition tags: empty
                return False
            pos += 1
        if pos >= n or p[pos] != 0:  # topic tags: empty
            return False
        pos += 1
    return pos + 1 == n and p[pos] == 0


def node_endpoints_absent(payload, api_key, api_version):
    """`protocol.rewrite.node_endpoints_absent`: True shown in C for the usual shapes; anything
    else is the reference's answer."""
    if type(payload) is not bytes or not (_small(api_key) and _small(api_version)):
        return _pure_node_endpoints_absent(payload, api_key, api_version)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    if api_key == PRODUCE and 10 <= api_version <= _PRODUCE_REWRITE_MAX:
        if _offset(p, n, PRODUCE, api_version) >= 0:  # the C walk ends at an empty tag section
            return True
    elif api_key == FETCH and 16 <= api_version <= _FETCH_REWRITE_MAX:
        if _fetch_tags_empty(p, n):
            return True
    return _pure_node_endpoints_absent(payload, api_key, api_version)


# --- the Fetch walk: per-partition bytes, records and error codes (protocol.records) -------------

from protocol import records as _records

cdef object _pure_fetch_response_partitions = _records.fetch_response_partitions
cdef object _traffic = _records._traffic

cdef object _count_records(const uint8_t* buf, Py_ssize_t start, Py_ssize_t end):
    """`records.count_records` in C (same answers: a total, or None for a legacy or impossible batch)."""
    cdef long long total = _walk_count_records(buf, start, end)
    return None if total < 0 else total


def count_records(buf, Py_ssize_t start, Py_ssize_t end):
    if type(buf) is not bytes or start < 0 or end > PyBytes_GET_SIZE(buf):
        return _records.count_records(buf, start, end)
    return _count_records(<const uint8_t*>PyBytes_AS_STRING(buf), start, end)


def fetch_response_partitions(payload, api_version):
    """`records.fetch_response_partitions` for the flexible versions (v12-v18) in their usual shape
    (one-byte array and name lengths, no aborted transactions, record sets under 2 MiB, empty tag
    sections); anything else, and any doubt, is the reference's."""
    if type(payload) is not bytes or not _small(api_version) or not 12 <= api_version <= 18:
        return _pure_fetch_response_partitions(payload, api_version)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef bint by_id = api_version >= 13
    cdef Py_ssize_t pos = 5, start, end, length
    cdef int n_topics, n_parts, t, i
    cdef int min_topic = (16 if by_id else 1) + 2
    cdef int min_partition = 30 + 4 + 3
    if n < 16 or p[4] != 0:
        return _pure_fetch_response_partitions(payload, api_version)
    cdef int top_error = _i16(p + 9)  # after the header tags and throttle_time_ms
    pos = 15  # error_code, session_id
    if p[pos] >= 0x80:
        return _pure_fetch_response_partitions(payload, api_version)
    n_topics = p[pos] - 1
    pos += 1
    if n_topics > 0 and n_topics * min_topic > n - pos:
        return _pure_fetch_response_partitions(payload, api_version)
    out = []
    for t in range(n_topics):
        if by_id:
            topic = None
            topic_id = read_topic_id(payload, n, &pos)
            if topic_id is None:
                return _pure_fetch_response_partitions(payload, api_version)
        else:
            topic_id = None
            topic = read_topic_name(payload, p, n, &pos)
            if topic is None:  # a null name, or not the usual shape: the reference says what it means
                return _pure_fetch_response_partitions(payload, api_version)
        if pos >= n or p[pos] >= 0x80:
            return _pure_fetch_response_partitions(payload, api_version)
        n_parts = p[pos] - 1
        pos += 1
        if n_parts > 0 and n_parts * min_partition > n - pos:
            return _pure_fetch_response_partitions(payload, api_version)
        for i in range(n_parts):
            # index, error_code, high_watermark, last_stable_offset, log_start_offset; aborted (null
            # or empty); preferred_read_replica; a records length of at most 3 varint bytes
            if pos + 30 + 1 + 4 + 3 > n or p[pos + 30] > 1:
                return _pure_fetch_response_partitions(payload, api_version)
            index = _i32(p + pos)
            error_code = _i16(p + pos + 4)
            pos += 35
            length = read_compact_length(p, &pos)
            if length < 0:
                return _pure_fetch_response_partitions(payload, api_version)
            start = pos
            end = pos + length
            if end >= n or p[end] != 0:  # past the payload, or partition tags that are not empty
                return _pure_fetch_response_partitions(payload, api_version)
            records = _count_records(p, start, end) if end > start else 0
            out.append(_traffic(topic, topic_id, index, records, end - start, error_code))
            pos = end + 1
        if pos >= n or p[pos] != 0:  # topic tags
            return _pure_fetch_response_partitions(payload, api_version)
        pos += 1
    if pos + 1 != n or p[pos] != 0:  # the response's tags, then exactly the end
        return _pure_fetch_response_partitions(payload, api_version)
    return top_error, out


# --- the per-request counters of /metrics (protocol.counters) -----------------------------------


cdef class RequestCounters:
    """`protocol.counters.RequestCounters` over C integers: API keys 0-127 in fixed arrays (every
    key Kafka has), any other key in a dictionary as the reference keeps them all."""

    cdef long long _requests[N_KEYS]
    cdef long long _request_bytes[N_KEYS]
    cdef long long _response_bytes[N_KEYS]
    cdef dict _others

    def __cinit__(self):
        cdef int k
        for k in range(N_KEYS):
            self._requests[k] = 0
            self._request_bytes[k] = 0
            self._response_bytes[k] = 0
        self._others = {}

    def on_complete(self, ctx, entry, sent_ms):
        key = entry.api_key
        request_bytes = entry.request_bytes
        response_bytes = entry.response_bytes
        cdef int k
        if type(key) is int and 0 <= key < N_KEYS:
            k = key
            self._requests[k] += 1
            self._request_bytes[k] += request_bytes
            self._response_bytes[k] += response_bytes
            return
        counts = self._others.get(key)
        if counts is None:
            counts = self._others[key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += request_bytes
        counts[2] += response_bytes

    def snapshot(self):
        cdef int k
        out = {}
        for k in range(N_KEYS):
            if self._requests[k]:
                out[k] = (self._requests[k], self._request_bytes[k], self._response_bytes[k])
        for key, c in self._others.items():
            out[key] = (c[0], c[1], c[2])
        return out


# ----------------------------------------------------------------------------- the streamed Fetch tail

from cpython.buffer cimport PyBUF_SIMPLE, PyObject_GetBuffer, PyBuffer_Release

from protocol import fetch_tail as _fetch_tail

# `protocol.fetch_tail`'s stages, in its order
cdef enum:
    TF_HEAD
    TF_HEAD_REST
    TF_TOPIC
    TF_PARTITION
    TF_ABORTED
    TF_PARTITION_REST
    TF_PARTITION_TAGS
    TF_TOPIC_TAGS
    TF_TAG_FIELD
    TF_TAIL
    TF_FAILED

cdef Py_ssize_t _TAIL_WINDOW_BYTES = _fetch_tail._WINDOW_BYTES
cdef Py_ssize_t _TAIL_MAX_STEP_BYTES = _fetch_tail._MAX_STEP_BYTES


cdef inline Py_ssize_t _uvarint(const uint8_t* p, Py_ssize_t n, Py_ssize_t pos,
                                long long* value) noexcept nogil:
    """`protocol._wire.read_uvarint`: the position after it, or -1 where that raises (truncated, or
    longer than 5 bytes)."""
    cdef long long v = 0
    cdef int shift = 0
    cdef int i
    cdef uint8_t byte
    for i in range(5):
        if pos + i >= n:
            return -1
        byte = p[pos + i]
        v |= (<long long>(byte & 0x7F)) << shift
        if not byte & 0x80:
            value[0] = v
            return pos + i + 1
        shift += 7
    return -1


cdef inline Py_ssize_t _count_after(const uint8_t* p, Py_ssize_t n, Py_ssize_t at, Py_ssize_t fixed,
                                    long long* count) noexcept nogil:
    """`skip(at, fixed)` then a compact array's `read_array_len` (null or empty: 0): the position
    after it, or -1 where those raise."""
    cdef long long value
    cdef Py_ssize_t pos = -1 if at + fixed > n else _uvarint(p, n, at + fixed, &value)
    if pos >= 0:
        count[0] = value - 1 if value > 0 else 0
    return pos


cdef class FetchTailFinder:
    """`protocol.fetch_tail.FetchTailFinder`, compiled: the same steps, the same buffering of a step
    split across chunks and the same answers; a step that cannot be read (truncated or malformed)
    is "not whole yet", as the reference's DecodeError is."""

    cdef int _stage, _then
    cdef Py_ssize_t _topic_id_bytes
    cdef bytearray _buf
    cdef long long _skip, _topics, _partitions, _left, _fields
    cdef public bytearray tail

    def __init__(self, api_version):
        if api_version < 12:
            raise ValueError(f"Fetch v{api_version} is not flexible: no top-level tag section")
        self._topic_id_bytes = 16 if api_version >= 13 else 0  # v12 has a topic name instead
        self._stage = TF_HEAD
        self._then = TF_HEAD_REST
        self._buf = bytearray()
        self._skip = self._topics = self._partitions = self._left = self._fields = 0
        self.tail = bytearray()

    @property
    def found(self):
        return self._stage == TF_TAIL and not self._skip

    def feed(self, chunk):
        cdef Py_buffer view
        PyObject_GetBuffer(chunk, &view, PyBUF_SIMPLE)
        try:
            return self._feed(chunk, <const uint8_t*>view.buf, view.len)
        finally:
            PyBuffer_Release(&view)

    cdef Py_ssize_t _feed(self, chunk, const uint8_t* p, Py_ssize_t n) except -1:
        cdef Py_ssize_t pos = 0, after, take, consumed, leftover, held
        cdef long long step
        while pos < n:
            if self._skip:  # records and tagged-field data: straight through
                step = self._skip if self._skip < n - pos else n - pos
                self._skip -= step
                pos += step
                continue
            if self._stage == TF_TAIL:
                self.tail += chunk[pos:]
                return pos
            if self._stage == TF_FAILED:
                return n
            held = PyByteArray_GET_SIZE(self._buf)
            if not held:  # the usual case: parse whole steps in place
                after = self._parse(p, n, pos)
                if after > pos:
                    pos = after
                    continue
            # a step split across chunks: buffer a window (doubling while it does not fit)
            take = n - pos
            if take > _TAIL_WINDOW_BYTES and take > held:
                take = _TAIL_WINDOW_BYTES if _TAIL_WINDOW_BYTES > held else held
            self._buf += chunk[pos:pos + take]
            held = PyByteArray_GET_SIZE(self._buf)
            consumed = self._parse(<const uint8_t*>PyByteArray_AS_STRING(self._buf), held, 0)
            if consumed == 0:  # still not whole: everything taken stays buffered
                pos += take
                if held > _TAIL_MAX_STEP_BYTES:
                    self._stage = TF_FAILED  # no real step is this large: give up, forward as is
                continue
            # the bytes after the last whole step go back to the chunk (records, tail or a part step)
            leftover = held - consumed
            del self._buf[:]
            pos += take - leftover
        return n

    cdef Py_ssize_t _parse(self, const uint8_t* p, Py_ssize_t n, Py_ssize_t at):
        """The whole steps from `at`; returns where they end (`at` if none is whole)."""
        cdef Py_ssize_t after
        while self._stage != TF_TAIL and self._stage != TF_FAILED and not self._skip:
            after = self._step(p, n, at)
            if after < 0:
                break
            at = after
        return at

    cdef Py_ssize_t _step(self, const uint8_t* p, Py_ssize_t n, Py_ssize_t at):
        """One step (`FetchTailFinder._step`): where it ends, or -1 (nothing changed) if it is not whole."""
        cdef int stage = self._stage
        cdef Py_ssize_t pos
        cdef long long value, size
        if stage == TF_HEAD:  # correlation_id, then the response header's tag section
            return -1 if at + 4 > n else self._tags(p, n, at + 4, TF_HEAD_REST)
        if stage == TF_HEAD_REST:  # throttle_time_ms, error_code, session_id, then the topics
            pos = _count_after(p, n, at, 10, &value)
            if pos < 0:
                return -1
            self._topics = value
            self._stage = TF_TOPIC if value else TF_TAIL
            return pos
        if stage == TF_TOPIC:
            if self._topic_id_bytes:
                pos = at
                size = self._topic_id_bytes + 1
            else:  # a compact nullable string: its length + 1, then its bytes
                pos = _uvarint(p, n, at, &size)
            if pos >= 0:
                pos = _count_after(p, n, pos, <Py_ssize_t>(size - 1) if size > 0 else 0, &value)
            if pos < 0:
                return -1
            self._partitions = value
            self._stage = TF_PARTITION if value else TF_TOPIC_TAGS
            return pos
        if stage == TF_PARTITION:
            # partition_index, error_code, high_watermark, last_stable_offset, log_start_offset
            pos = _count_after(p, n, at, 30, &value)
            if pos < 0:
                return -1
            self._left = value
            self._stage = TF_ABORTED if value else TF_PARTITION_REST
            return pos
        if stage == TF_ABORTED:  # one aborted transaction: producer_id, first_offset, then its tags
            return -1 if at + 16 > n else self._tags(p, n, at + 16, TF_ABORTED)
        if stage == TF_PARTITION_REST:  # preferred_read_replica, then the records' compact length
            pos = -1 if at + 4 > n else _uvarint(p, n, at + 4, &value)
            if pos < 0:
                return -1
            self._skip = value - 1 if value > 1 else 0
            self._stage = TF_PARTITION_TAGS
            return pos
        if stage == TF_PARTITION_TAGS or stage == TF_TOPIC_TAGS:
            return self._tags(p, n, at, stage)
        # TF_TAG_FIELD: tag and size; the data passes through like records (never buffered)
        pos = _uvarint(p, n, at, &value)
        if pos >= 0:
            pos = _uvarint(p, n, pos, &size)
        if pos < 0:
            return -1
        self._skip = size
        self._fields -= 1
        if not self._fields:
            self._after_tags(self._then)
        return pos

    cdef Py_ssize_t _tags(self, const uint8_t* p, Py_ssize_t n, Py_ssize_t at, int then):
        """A tag section's field count; its fields follow as `TF_TAG_FIELD` steps, then `then`."""
        cdef long long count
        cdef Py_ssize_t pos = _uvarint(p, n, at, &count)
        if pos < 0:
            return -1
        if count:
            self._fields, self._then, self._stage = count, then, TF_TAG_FIELD
        else:
            self._after_tags(then)
        return pos

    cdef void _after_tags(self, int then):
        if then == TF_ABORTED:
            self._left -= 1
            self._stage = TF_ABORTED if self._left else TF_PARTITION_REST
        elif then == TF_PARTITION_TAGS:
            self._partitions -= 1
            self._stage = TF_PARTITION if self._partitions else TF_TOPIC_TAGS
        elif then == TF_TOPIC_TAGS:
            self._topics -= 1
            self._stage = TF_TOPIC if self._topics else TF_TAIL
        else:
            self._stage = then
