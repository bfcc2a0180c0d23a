# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compiled twins of the access log's Produce walks (Cython). The readable reference is
`protocol.log_walks`; `protocol.log_fastpath` picks the implementation.

As in `protocol._speedups`: the common, well-formed flexible case (Produce v9-v13 with one-byte
array and string lengths, record sets under 2 MiB, empty tag sections, no record errors or error
messages) is read in C; anything else, and any doubt, is handed to the reference, which then
answers or raises exactly as it always did (tests/unit/differential/test_log_walks.py).

No I/O, no asyncio: this is part of the sans-IO `protocol` package.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int16_t, int32_t, uint8_t, uint16_t, uint32_t

from protocol import log_walks as _log_walks

cdef object _pure_produce_log_parts = _log_walks.produce_log_parts
cdef object _pure_produce_log_summary = _log_walks.produce_log_summary

DEF BATCH_HEADER_BYTES = 61
DEF LOG_OVERHEAD = 12
DEF MAGIC_OFFSET = 16
DEF MAGIC_V2 = 2
DEF MAX_CODES = 32


cdef inline int32_t _i32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])


cdef inline int16_t _i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | <uint16_t>p[1])


cdef long long _count_records(const uint8_t* buf, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """`records.count_records` in C: the total, or -1 where the reference answers None."""
    cdef long long total = 0
    cdef Py_ssize_t pos = start
    cdef int32_t batch_length, count
    while pos < end:
        if end - pos < BATCH_HEADER_BYTES:
            if end - pos > MAGIC_OFFSET and buf[pos + MAGIC_OFFSET] != MAGIC_V2:
                return -1
            return total
        batch_length = _i32(buf + pos + 8)
        count = _i32(buf + pos + 57)
        if buf[pos + MAGIC_OFFSET] != MAGIC_V2 or batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD or count < 0:
            return -1
        pos += LOG_OVERHEAD + batch_length
        if pos > end:
            return total
        total += count
    return total


def produce_log_parts(payload, header):
    """`log_walks.produce_log_parts` for Produce v9-v13 requests in their usual shape."""
    if type(payload) is not bytes or header.api_key != 0:
        return _pure_produce_log_parts(payload, header)
    version = header.api_version
    body = header.body_offset
    if type(version) is not int or not 9 <= version <= 13 or type(body) is not int:
        return _pure_produce_log_parts(payload, header)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
    cdef bint by_id = version >= 13
    cdef Py_ssize_t pos = body, start, end
    cdef int n_topics, n_parts, t, i, length_plus_one
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
            if pos + 16 > n:
                return _pure_produce_log_parts(payload, header)
            topic = None
            topic_id = payload[pos : pos + 16]
            pos += 16
        else:
            if pos >= n or p[pos] >= 0x80 or p[pos] == 0:  # a null name: the reference says what it means
                return _pure_produce_log_parts(payload, header)
            end = pos + p[pos]
            if end > n:
                return _pure_produce_log_parts(payload, header)
            topic = payload[pos + 1 : end].decode("utf-8", "replace")
            topic_id = None
            pos = end
        if pos >= n or p[pos] >= 0x80 or p[pos] == 0:
            return _pure_produce_log_parts(payload, header)
        n_parts = p[pos] - 1
        pos += 1
        for i in range(n_parts):
            if pos + 4 + 3 > n:
                return _pure_produce_log_parts(payload, header)
            index = _i32(p + pos)
            pos += 4
            if p[pos] < 0x80:
                length_plus_one = p[pos]
                pos += 1
            elif p[pos + 1] < 0x80:
                length_plus_one = (p[pos] & 0x7F) | (p[pos + 1] << 7)
                pos += 2
            elif p[pos + 2] < 0x80:
                length_plus_one = (p[pos] & 0x7F) | ((p[pos + 1] & 0x7F) << 7) | (p[pos + 2] << 14)
                pos += 3
            else:
                return _pure_produce_log_parts(payload, header)
            start = pos
            end = pos + (length_plus_one - 1 if length_plus_one else 0)
            if end >= n or p[end] != 0:  # past the payload, or partition tags that are not empty
                return _pure_produce_log_parts(payload, header)
            out.append((topic, topic_id, index, _count_records(p, start, end), end - start))
            pos = end + 1
        if pos >= n or p[pos] != 0:  # topic tags
            return _pure_produce_log_parts(payload, header)
        pos += 1
    if pos + 1 != n or p[pos] != 0:  # the request's tags, then exactly the end
        return _pure_produce_log_parts(payload, header)
    return tuple(out)


def produce_log_summary(payload, api_version):
    """`log_walks.produce_log_summary` for Produce v9-v13 responses in their usual shape."""
    if type(payload) is not bytes or type(api_version) is not int or not 9 <= api_version <= 13:
        return _pure_produce_log_summary(payload, api_version)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(payload)
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
            code = _i16(p + pos + 4)
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
    return tuple(sorted([codes[k] for k in range(found)])), _i32(p + pos)
