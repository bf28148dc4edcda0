"""`python -m caprag.books FOLDER`: check book files (the code is `caprag.retrieval.books`)."""

from caprag.retrieval.books import main

if __name__ == "__main__":
    raise SystemExit(main())
