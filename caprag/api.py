"""`python -m caprag.api`: serve the API and the chat page (the code is `caprag.serve.api`)."""

from caprag.serve.api import app, main

__all__ = ["app", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
