"""`ServeError`: a request the server refuses, with OpenAI's error body."""

from __future__ import annotations


class ServeError(Exception):
    """A request the server refuses: HTTP `status` and OpenAI's error body. `code` is OpenAI's
    machine-readable code where clients act on one (``context_length_exceeded``), else the status.
    The message is kept encodable whatever client text it quotes (a lone surrogate is escaped)."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 code: str | None = None):
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code if self.code is not None else self.status}}
