"""Where models meet the features: point-in-time training sets and their lineage, MLflow tracking of every
run, and a logged model that fetches its own features online."""
