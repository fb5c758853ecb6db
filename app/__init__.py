"""The NaN Forensics dashboard: ``forensics app [PATH]`` runs ``streamlit_app.py``."""
