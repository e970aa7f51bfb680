# /// script
# dependencies = ["rich"]
#
# [tool.uv]
# exclude-newer = "2024-01-01T00:00:00Z"
# [tool.uv.sources]
# rich = { index = "x" }
# ///
