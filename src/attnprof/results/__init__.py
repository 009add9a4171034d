"""The typed, versioned result row of a cell or a model, its writer and its reader (see `schema` and `files`);
below both pipeline and report, so neither reaches into the other."""
