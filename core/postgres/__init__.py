"""The service's database backend: Django's PostgreSQL one whose health check asks the socket first."""
