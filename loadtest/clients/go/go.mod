module loadclient

go 1.22

require github.com/gobwas/ws v1.4.0

require (
	github.com/gobwas/httphead v0.1.0 // indirect
	github.com/gobwas/pool v0.2.1 // indirect
)
