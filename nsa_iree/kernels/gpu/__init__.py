"""The GPU kernel families (nvidia/, portable/) and the text they share."""
