"""The model repository: scanning its folders, watching them, importing a model file."""
