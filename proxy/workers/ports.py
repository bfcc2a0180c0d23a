"""Ports the supervisor reserves when the configuration asks for ephemeral ones (`listen` port 0).

Every worker must listen on the same ports, so the supervisor chooses them first: it binds the
bootstrap port and, without `broker_port_base`, the per-broker ports that follow it (listen port + 1 +
node id, node ids 0 to `broker_slots` - 1) with SO_REUSEPORT, and keeps those sockets open but not
listening, so that no other program takes them while the workers (which bind the same ports with
SO_REUSEPORT) accept every connection.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass, field


@dataclass
class Reservation:
    port: int
    sockets: list[socket.socket] = field(default_factory=list)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()


def _reuse_port_socket(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _free(host: str, port: int) -> bool:
    """Nothing is bound to `port` (a bind without SO_REUSEPORT would fail if anything were)."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        probe.bind((host, port))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def reserve_ports(host: str, broker_slots: int, attempts: int = 50) -> Reservation:
    """A free bootstrap port P (and P+1 .. P+broker_slots, when broker_slots > 0), held with SO_REUSEPORT."""
    for _ in range(attempts):
        first = _reuse_port_socket(host)
        first.bind((host, 0))
        reservation = Reservation(int(first.getsockname()[1]), [first])
        try:
            for port in range(reservation.port + 1, reservation.port + 1 + broker_slots):
                if port > 65535 or not _free(host, port):
                    raise OSError(f"port {port} is taken")
                sock = _reuse_port_socket(host)
                reservation.sockets.append(sock)
                sock.bind((host, port))
        except OSError:
            reservation.close()
            continue
        return reservation
    raise OSError(f"no run of {broker_slots + 1} free ports on {host} after {attempts} attempts")


def close_quietly(reservation: Reservation | None) -> None:
    if reservation is not None:
        with contextlib.suppress(OSError):
            reservation.close()
