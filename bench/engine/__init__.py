"""What the products run on: configs, run directories, results files, executors, workers, measurement, provenance."""
