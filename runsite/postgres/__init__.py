"""Django's PostgreSQL backend with Runsite's connection pool (runsite/dbpool.py)."""
