"""The dashboard's pages; UI only, fed by :mod:`app.data`."""
