#include "clients/text.h"

#include "gtest/gtest.h"
#include "topiary/v1/checkpoint.pb.h"

namespace topiary {
namespace {

TEST(JsonString, EscapesWhatJsonRequires) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("it's \"q\" \\"), "\"it's \\\"q\\\" \\\\\"");  // no \' (not JSON)
  EXPECT_EQ(JsonString(std::string("a\nb\tc\x01\x7f", 7)), "\"a\\nb\\tc\\u0001\\u007f\"");
  EXPECT_EQ(JsonString("\xc3\xa9t\xc3\xa9"), "\"\xc3\xa9t\xc3\xa9\"");  // UTF-8 kept
  EXPECT_EQ(JsonString("bad\xff\xc3("), "\"bad\\ufffd\\ufffd(\"");      // invalid replaced
  EXPECT_EQ(JsonString("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");   // a surrogate
}

TEST(OneLine, ControlCharactersCannotBreakATable) {
  EXPECT_EQ(OneLine("two\nlines\x1b[2J"), "two?lines?[2J");
  // C1 controls (NEL, CSI), bidirectional overrides and isolates, invalid bytes.
  EXPECT_EQ(OneLine("a\xc2\x85"
                    "b\xc2\x9b"
                    "c"),
            "a?b?c");
  EXPECT_EQ(OneLine("exp\xe2\x80\xaetxt.exe"), "exp?txt.exe");
  EXPECT_EQ(OneLine("\xe2\x81\xa6x\xe2\x81\xa9"), "?x?");
  EXPECT_EQ(OneLine("bad\xff\xc3"), "bad??");
  EXPECT_EQ(OneLine("caf\xc3\xa9 \xe6\x97\xa5"), "caf\xc3\xa9 \xe6\x97\xa5");  // text stays
}

TEST(ScriptJson, Int64AsNumbersMetricsNestedEnumsByName) {
  topiary::v1::CheckpointReport report;
  report.set_parameters(int64_t{1} << 40);
  report.mutable_metrics()->set_test_top1(0.5);
  report.mutable_metrics()->add_rounds()->set_round(1);
  auto* layer = report.add_layers();
  layer->set_layer("conv1");
  layer->add_shape(16);
  layer->add_shape(3);
  layer->set_mask(topiary::v1::MASK_BLOCK);
  layer->set_sparsity(0.1);
  layer->mutable_approximation()->add_activation_range(0.1f);
  const std::string json = ScriptJson(report);
  EXPECT_NE(json.find("\"parameters\":1099511627776,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"metrics\":{\"test_top1\":0.5,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"rounds\":[{\"round\":1,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"shape\":[16,3]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"mask\":\"MASK_BLOCK\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"sparsity\":0.1,"), std::string::npos) << json;  // shortest form
  // A float field at float precision, not as the double 0.10000000149011612.
  EXPECT_NE(json.find("\"activation_range\":[0.1]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"global_step\":0"), std::string::npos) << json;  // defaults printed
}

}  // namespace
}  // namespace topiary
