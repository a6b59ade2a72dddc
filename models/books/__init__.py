"""Books: parsing a book file into chapters (`parse`) and assembling the rendered
segments into chapter files and an audiobook (`assemble`)."""
