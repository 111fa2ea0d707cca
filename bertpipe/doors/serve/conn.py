"""Connections that send no complete request head are closed: the service's HTTP protocol (uvicorn's httptools one)
with a deadline for the request line and headers.

uvicorn times out an idle connection only after a response (``timeout_keep_alive``) and has no deadline for the head:
a connection that sends nothing, or a header byte every few seconds, stays open for ever, and enough of them exhaust
the process's file descriptors. Here the head must arrive within ``head_timeout_s`` of the connection opening or of
the previous response ending; otherwise the connection gets 408 and is closed. The body has its own deadline
(``serve.body_timeout_s``, in the Guard).
"""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

REQUEST_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def head_timeout_protocol(head_timeout_s: float) -> type:
    """The protocol class to hand uvicorn (``http=``), with its deadline."""

    class HeadTimeoutProtocol(HttpToolsProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer = None
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._head_timer = self.loop.call_later(head_timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _idle(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing() or not self._idle():
                return
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and self._idle():  # not when a pipelined request started
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeadTimeoutProtocol
