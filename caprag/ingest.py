"""`python -m caprag.ingest FOLDER`: (re-)index books (the code is `caprag.retrieval.ingest`)."""

from caprag.retrieval.ingest import main

if __name__ == "__main__":
    raise SystemExit(main())
