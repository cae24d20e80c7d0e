"""The only package that speaks SQL (SQLAlchemy 2.0). Everyone else calls its functions."""
