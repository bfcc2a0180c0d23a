# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled twins of the access log's Produce walks (Cython). The readable reference is
`protocol.log_walks`; `protocol.log_fastpath` picks the implementation.

As in `protocol._speedups`: the common, well-formed cases are read in C: the flexible versions
(Produce v9-v13 with one-byte array and string lengths, record sets under 2 MiB, empty tag
sections, no record errors or error messages) and the older ones (requests v3-v8, responses v1-v8:
no null names or record sets, no record errors); anything else, and any doubt, is handed to the
reference, which then answers or raises exactly as it always did
(tests/unit/differential/test_log_walks.py).

No I/O, no asyncio: this is part of the sans-IO `protocol` package.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, uint8_t

from protocol._walk cimport count_records, read_compact_length, read_i16, read_i32, read_topic_id, read_topic_name
from protocol import log_walks as _log_walks

cdef object _pure_produce_log_parts = _log_walks.produce_log_parts
cdef object _pure_produce_log_summary = _log_walks.produce_log_summary

DEF MAX_CODES = 32


cdef object _NOT_READ = object()  # a legacy walk's "not the usual shape": the reference decides


cdef inline bint _note_code(int16_t* codes, int* found, int16_t code) noexcept:
    """Add a non-zero error code to the distinct ones found; False when there are too many."""
    cdef int k
    if code == 0:
        return True
    for k in range(found[0]):
        if codes[k] == code:
            return True
    if found[0] == MAX_CODES:
        return False
    codes[found[0]] = code
    found[0] += 1
    return True


cdef object _legacy_parts(bytes payload, const uint8_t* p, Py_ssize_t n, Py_ssize_t pos):
    """Produce v3-v8 requests (int16 string and int32 array and bytes lengths, no tags), from the
    transactional_id at `pos`; `_NOT_READ` for a null or negative length, or a layout that does
    not end exactly at the end of the payload."""
    cdef int32_t n_topics, n_parts, t, i, length
    cdef Py_ssize_t start, end
    if pos < 0 or pos + 2 > n:
        return _NOT_READ
    length = read_i16(p + pos)  # transactional_id: -1 = null
    if length < -1:
        return _NOT_READ
    pos += 2 + (length if length > 0 else 0) + 6  # the id, acks, timeout_ms
    if pos + 4 > n:
        return _NOT_READ
    n_topics = read_i32(p + pos)
    pos += 4
    if n_topics < 0:
        return _NOT_READ
    out = []
    for t in range(n_topics):
        if pos + 2 > n:
            return _NOT_READ
        length = read_i16(p + pos)
        end = pos + 2 + length
        if length < 0 or end + 4 > n:
            return _NOT_READ
        topic = payload[pos + 2 : end].decode("utf-8", "replace")
        n_parts = read_i32(p + end)
        pos = end + 4
        if n_parts < 0:
            return _NOT_READ
        for i in range(n_parts):
            if pos + 8 > n:
                return _NOT_READ
            index = read_i32(p + pos)
            length = read_i32(p + pos + 4)
            start = pos + 8
            end = start + length
            if length < 0 or end > n:
                return _NOT_READ
            out.append((topic, None, index, count_records(p, start, end), length))
            pos = end
    if pos != n:
        return _NOT_READ
    return tuple(out)


cdef object _legacy_summary(const uint8_t* p, Py_ssize_t n, int api_version):
    """Produce v1-v8 responses (response header v0); `_NOT_READ` for a null or negative length,
    too many distinct error codes, or a layout that does not end exactly at the end."""
    cdef Py_ssize_t fixed = 14 + (8 if api_version >= 2 else 0) + (8 if api_version >= 5 else 0)
    cdef Py_ssize_t pos = 4
    cdef int32_t n_topics, n_parts, t, i, length
    cdef int k, found = 0
    cdef int16_t codes[MAX_CODES]
    if n < 8:
        return _NOT_READ
    n_topics = read_i32(p + pos)
    pos += 4
    if n_topics < 0:
        return _NOT_READ
    for t in range(n_topics):
        if pos + 2 > n:
            return _NOT_READ
        length = read_i16(p + pos)
        pos += 2 + length
        if length < 0 or pos + 4 > n:
            return _NOT_READ
        n_parts = read_i32(p + pos)
        pos += 4
        if n_parts < 0:
            return _NOT_READ
        for i in range(n_parts):
            # index, error_code, base_offset, log_append_time_ms (v2+), log_start_offset (v5+)
            if pos + fixed > n or not _note_code(codes, &found, read_i16(p + pos + 4)):
                return _NOT_READ
            pos += fixed
            if api_version >= 8:  # record_errors (empty), error_message (null or a string)
                if pos + 6 > n or read_i32(p + pos) != 0:
                    return _NOT_READ
                length = read_i16(p + pos + 4)
                pos += 6 + (length if length > 0 else 0)
                if length < -1:
                    return _NOT_READ
    if pos + 4 != n:
        return _NOT_READ
    return tuple(sorted([codes[k] for k in range(found)])), read_i32(p + pos)


def produce_log_parts(payload, header):
    """`log_walks.produce_log_parts` for Produce v3-v13 requests in their usual shape."""
    if type(payload) is not bytes or header.api_key != 0:
        return _pure_produce_log_parts(payload, header)
    version = header.api_version
    body = header.body_offset
    if type(version) is not int or not 3 <= version <= 13 or type(body) is not int:
        return _pure_produce_log_parts(payload, header)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    if version <= 8:
        legacy = _legacy_parts(payload, p, n, body)
        return _pure_produce_log_parts(payload, header) if legacy is _NOT_READ else legacy
    cdef bint by_id = version >= 13
    cdef Py_ssize_t pos = body, start, end, length
    cdef int n_topics, n_parts, t, i
    if pos < 0 or pos >= n or p[pos] >= 0x80:  # transactional_id: a one-byte length (or null)
        return _pure_produce_log_parts(payload, header)
    pos += 1 + (p[pos] - 1 if p[pos] else 0) + 6  # the id, acks, timeout_ms
    if pos >= n or p[pos] >= 0x80 or p[pos] == 0:
        return _pure_produce_log_parts(payload, header)
    n_topics = p[pos] - 1
    pos += 1
    out = []
    for t in range(n_topics):
        if by_id:
            topic = None
            topic_id = read_topic_id(payload, n, &pos)
            if topic_id is None:
                return _pure_produce_log_parts(payload, header)
        else:
            topic_id = None
            topic = read_topic_name(payload, p, n, &pos)
            if topic is None:  # a null name, or not the usual shape: the reference says what it means
                return _pure_produce_log_parts(payload, header)
        if pos >= n or p[pos] >= 0x80 or p[pos] == 0:
            return _pure_produce_log_parts(payload, header)
        n_parts = p[pos] - 1
        pos += 1
        for i in range(n_parts):
            if pos + 4 + 3 > n:
                return _pure_produce_log_parts(payload, header)
            index = read_i32(p + pos)
            pos += 4
            length = read_compact_length(p, &pos)
            if length < 0:
                return _pure_produce_log_parts(payload, header)
            start = pos
            end = pos + length
            if end >= n or p[end] != 0:  # past the payload, or partition tags that are not empty
                return _pure_produce_log_parts(payload, header)
            out.append((topic, topic_id, index, count_records(p, start, end), end - start))
            pos = end + 1
        if pos >= n or p[pos] != 0:  # topic tags
            return _pure_produce_log_parts(payload, header)
        pos += 1
    if pos + 1 != n or p[pos] != 0:  # the request's tags, then exactly the end
        return _pure_produce_log_parts(payload, header)
    return tuple(out)


def produce_log_summary(payload, api_version):
    """`log_walks.produce_log_summary` for Produce v1-v13 responses in their usual shape."""
    if type(payload) is not bytes or type(api_version) is not int or not 1 <= api_version <= 13:
        return _pure_produce_log_summary(payload, api_version)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    if api_version <= 8:
        legacy = _legacy_summary(p, n, api_version)
        return _pure_produce_log_summary(payload, api_version) if legacy is _NOT_READ else legacy
    cdef bint by_id = api_version >= 13
    cdef Py_ssize_t pos = 5
    cdef int n_topics, n_parts, t, i, k, found = 0
    cdef int16_t code
    cdef int16_t codes[MAX_CODES]
    if n < 6 or p[4] != 0 or p[pos] >= 0x80 or p[pos] == 0:  # header tags; responses: one-byte length
        return _pure_produce_log_summary(payload, api_version)
    n_topics = p[pos] - 1
    pos += 1
    for t in range(n_topics):
        if by_id:
            pos += 16
        elif pos < n and 0 < p[pos] < 0x80:
            pos += p[pos]
        else:
            return _pure_produce_log_summary(payload, api_version)
        if pos >= n or p[pos] >= 0x80 or p[pos] == 0:
            return _pure_produce_log_summary(payload, api_version)
        n_parts = p[pos] - 1
        pos += 1
        for i in range(n_parts):
            # index, error_code, base_offset, log_append_time_ms, log_start_offset; then no record
            # errors, a null error message and no tags
            if pos + 33 > n or p[pos + 30] != 1 or p[pos + 31] != 0 or p[pos + 32] != 0:
                return _pure_produce_log_summary(payload, api_version)
            code = read_i16(p + pos + 4)
            if code != 0:
                for k in range(found):
                    if codes[k] == code:
                        break
                else:
                    if found == MAX_CODES:
                        return _pure_produce_log_summary(payload, api_version)
                    codes[found] = code
                    found += 1
            pos += 33
        if pos >= n or p[pos] != 0:  # topic tags
            return _pure_produce_log_summary(payload, api_version)
        pos += 1
    if pos + 5 != n or p[pos + 4] != 0:  # throttle_time_ms, the response's tags, then the end
        return _pure_produce_log_summary(payload, api_version)
    return tuple(sorted([codes[k] for k in range(found)])), read_i32(p + pos)
