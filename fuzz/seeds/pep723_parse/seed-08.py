# /// script
# dependencies = ["a"]
import a
