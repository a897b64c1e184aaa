"""API errors in OpenAI's shape: {"error": {"message", "type", "code", "param"}} with the HTTP status they go with."""

from fastapi.responses import JSONResponse

# HTTP status -> OpenAI's error type
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "server_unavailable", 500: "server_error"}


class ApiError(Exception):
    """A request the API refuses: status, a message the client can act on, and a short machine code."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict:
        """The JSON body of the error response."""
        return error_body(self.status, self.message, self.code, self.param)

    def response(self) -> JSONResponse:
        """The error as a response."""
        return JSONResponse(self.body(), status_code=self.status)


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict:
    """OpenAI's error object for a status (a lone surrogate a client sent, echoed in the message, written escaped)."""
    def text(s: str | None) -> str | None:
        return None if s is None else s.encode("utf-8", "backslashreplace").decode("utf-8")

    return {"error": {"message": text(message), "type": _TYPES.get(status, "invalid_request_error"),
                      "code": code, "param": text(param)}}
