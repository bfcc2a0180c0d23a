# cython: language_level=3
"""Filling and reading a `__slots__` class's instance from C (Cython, inline).

The per-request objects (`protocol.headers.RequestHeader`, `proxy.flow.inflight.InFlight`) are
slotted dataclasses: their generated `__init__` is a Python function, entered for every request.
The compiled byte path makes the same object another way: `object.__new__(cls)` (every slot
empty), then each slot stored at the offset its member descriptor records, which is what the
descriptor's own `__set__` does (a T_OBJECT_EX member: the new value referenced, the old one
released). `slot_offset` reads a field's offset once, at import, and refuses anything that is not
such a member. The differential tests compare the objects made here with the constructor's.

`get` reads a slot the same way, as the descriptor's `__get__` does, without the attribute lookup
(the type's dictionary and method cache, the descriptor call) that a read of `obj.name` costs from
C. A caller must know `obj`'s exact type: the offsets are that class's.
"""

from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM

cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    int T_OBJECT_EX  # an object slot that raises AttributeError while empty
    int READONLY

cdef extern from "Python.h":
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member


cdef inline Py_ssize_t slot_offset(object cls, str name) except -1:
    """Where `cls` keeps its slot `name` in an instance (its member descriptor's offset)."""
    descr = cls.__dict__.get(name)
    if type(descr).__name__ != "member_descriptor":
        raise TypeError(f"{cls.__name__}.{name} is not a slot")
    cdef PyMemberDef *member = (<PyMemberDescrObject *><PyObject *>descr).d_member
    if member.type != T_OBJECT_EX or member.flags & READONLY:
        raise TypeError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


cdef inline void put(object obj, Py_ssize_t offset, object value):
    """`obj`'s slot at `offset` = `value` (the member descriptor's `__set__`, without the lookup)."""
    cdef PyObject **slot = <PyObject **>((<char *><PyObject *>obj) + offset)
    cdef PyObject *old = slot[0]
    Py_INCREF(value)
    slot[0] = <PyObject *>value
    Py_XDECREF(old)


cdef inline object get(object obj, Py_ssize_t offset):
    """`obj`'s slot at `offset` (the member descriptor's `__get__`): AttributeError while it is empty."""
    cdef PyObject *value = (<PyObject **>((<char *><PyObject *>obj) + offset))[0]
    if value is NULL:
        raise AttributeError(f"a slot of {type(obj).__name__} is empty")
    return <object>value


cdef inline int offsets_of(object cls, tuple names, Py_ssize_t *out, Py_ssize_t capacity) except -1:
    """`out[i]` = the offset of `cls`'s slot `names[i]` (at most `capacity` names)."""
    if len(names) > capacity:
        raise ValueError(f"{len(names)} slots of {cls.__name__}, room for {capacity}")
    cdef Py_ssize_t k
    for k in range(len(names)):
        out[k] = slot_offset(cls, names[k])
    return 0


cdef inline void fill(object obj, const Py_ssize_t *offsets, tuple values):
    """`obj`'s slot at `offsets[i]` = `values[i]`, for every value."""
    cdef Py_ssize_t k
    for k in range(len(values)):
        put(obj, offsets[k], <object>PyTuple_GET_ITEM(values, k))
