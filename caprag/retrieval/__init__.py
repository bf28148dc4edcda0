"""The retrieval room: passages and the indexes over them.

Book parsing and the catalogue (`books`, `catalog`), passage stores (`store`: Chroma parent/child;
`chroma_server`: a shared Chroma server), BM25 (`lexical`), hybrid fusion (`hybrid`), embeddings
(`embeddings`, `onnx_minilm`), the retriever registry (`retrievers`), the `Retriever` protocol
(`base`) and indexing (`ingest`). It knows nothing of strategies or serving.
"""
