"""`ServeError`: a request the server refuses, with OpenAI's error body."""

from __future__ import annotations


class ServeError(Exception):
    """A request the server refuses: HTTP `status` and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
