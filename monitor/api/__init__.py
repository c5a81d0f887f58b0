"""The read API for applications: /api/v1/ (views), its answers (answers), its tokens
(tokens) and its OpenAPI description (openapi)."""
