module github.com/durallm/durallm

go 1.26.8

require golang.org/x/net v0.60.0

require golang.org/x/text v0.42.0 // indirect
