"""Streamlit dashboard over the MLflow store: runs, comparisons, hop traces, live questions."""
