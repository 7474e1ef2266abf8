"""Steps, stable steps, layer/family labels and segments over an ingested trace."""
