"""Everything that touches private records or draws privacy noise lives in this package."""
