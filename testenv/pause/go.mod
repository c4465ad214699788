module github.com/cozystack/gpuclass-hooks/testenv/pause

go 1.26.0
