#include "trainer/util/sha256.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

namespace topiary {
namespace {

std::string Hash(const std::string& s) { return Sha256Hex(s.data(), s.size()); }

// FIPS 180-4 examples and lengths around the padding boundary (55, 56, 64 bytes), checked
// against coreutils' sha256sum.
TEST(Sha256, KnownDigests) {
  EXPECT_EQ(Hash(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hash(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(Hash(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(Hash(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  EXPECT_EQ(Hash(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Fed in pieces of every size around the block length, the digest is the one-shot one.
TEST(Sha256, PiecesGiveTheSameDigest) {
  std::string data(1000, 0);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  const std::string whole = Hash(data);
  for (size_t piece : {1, 3, 63, 64, 65, 127, 999}) {
    Sha256 h;
    for (size_t off = 0; off < data.size(); off += piece) {
      h.Update(data.data() + off, std::min(piece, data.size() - off));
    }
    EXPECT_EQ(h.HexDigest(), whole) << "pieces of " << piece;
  }
  Sha256 h;
  h.Update("ab", 2);
  EXPECT_NE(h.HexDigest(), Hash("abc"));  // a digest mid-stream does not end the stream
  h.Update("c", 1);
  EXPECT_EQ(h.HexDigest(), Hash("abc"));
}

}  // namespace
}  // namespace topiary
